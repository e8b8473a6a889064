#pragma once
// Dropout whose mask is a counter-based hash of one 64-bit key, fused with the scaling: one pass
// over the activations forward, one backward, and a byte mask saved instead of a float one.
// LibTorch's CPU dropout (bernoulli_ into a float tensor, then div_, then mul, the float tensor
// kept for backward) took 23 % of the Fashion-MNIST MLP's step; this one under 2 %.
//
//   y = model::dropout(x, 0.1, is_training());      // or the module: Dropout(0.1)
//
// The key is the next 64 bits of the default CPU generator, so a run repeats under the same seed,
// a saved and restored generator (checkpoint, activation checkpointing's replay, the invariant
// mode's reseeding per shard) replays the same mask, and element i's draw depends on (key, i)
// alone: the same mask whatever the thread count. Each element is kept with probability 1 - p
// to 2^-32; a dropped element is x * 0 (a NaN stays NaN, as in PyTorch). Tensors off the CPU
// take LibTorch's dropout (the GPU's is already fused).
#include <torch/torch.h>

#include <cstdint>

namespace mltrain::model {

torch::Tensor dropout(const torch::Tensor& x, double p, bool training);

// The keep mask alone (1 = kept) for n elements from `key`, elements [offset, offset + n) of the
// stream; what dropout() applies. Exposed for tests of the draw's statistics.
void dropout_keep_mask(uint64_t key, double p, int64_t offset, int64_t n, uint8_t* out);

struct DropoutImpl : torch::nn::Module {
  explicit DropoutImpl(double p) : p(p) {}
  torch::Tensor forward(const torch::Tensor& x) { return model::dropout(x, p, is_training()); }
  void pretty_print(std::ostream& out) const override { out << "mltrain::Dropout(p=" << p << ")"; }
  double p;
};
TORCH_MODULE(Dropout);

}  // namespace mltrain::model
