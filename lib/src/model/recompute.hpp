#pragma once
// Activation checkpointing (memory.checkpoint): a segment of blocks runs forward without keeping
// its activations; backward runs it again with gradients on and backpropagates through the copy.
// What makes the gradients bitwise equal to a run without checkpointing: the recomputation starts
// from the RNG states (CPU and CUDA generators: dropout) and the buffers (BatchNorm running
// statistics, which the second forward would otherwise update twice) the first forward started
// from, under the same autocast state; the RNG is put back afterwards, so nothing after the
// segment draws differently. Only the segment's input is saved.
//
//   x = recompute(x, [&](const torch::Tensor& t) { return block->forward(t); }, block_buffers);
#include <torch/torch.h>

#include <functional>
#include <vector>

namespace mltrain::model {

using SegmentFn = std::function<torch::Tensor(const torch::Tensor&)>;

// fn(x) with its activations recomputed in backward; a plain call when gradients are off.
// `buffers`: tensors fn updates in place (restored before the recomputation).
torch::Tensor recompute(const torch::Tensor& x, SegmentFn fn, std::vector<torch::Tensor> buffers);

// Segments of `every` consecutive blocks (0: no checkpointing): runs blocks[0..n) over x.
template <class Block, class Call, class Buffers>
torch::Tensor run_segments(std::vector<Block>& blocks, int64_t every, torch::Tensor x, Call call,
                           Buffers buffers_of) {
  const int64_t n = static_cast<int64_t>(blocks.size());
  if (every <= 0 || !torch::GradMode::is_enabled()) {
    for (auto& b : blocks) x = call(b, x);
    return x;
  }
  for (int64_t s = 0; s < n; s += every) {
    const int64_t e = std::min(n, s + every);
    std::vector<torch::Tensor> buffers;
    for (int64_t i = s; i < e; ++i)
      for (auto& t : buffers_of(blocks[i])) buffers.push_back(t);
    x = recompute(
        x,
        [&blocks, s, e, call](const torch::Tensor& in) {
          torch::Tensor y = in;
          for (int64_t i = s; i < e; ++i) y = call(blocks[i], y);
          return y;
        },
        std::move(buffers));
  }
  return x;
}

}  // namespace mltrain::model
