#pragma once
// A user's TorchScript model or exported program on mltrain's own kernels: the forward graph is inlined and two
// patterns are rewritten to operators of the `mltrain` namespace, registered with the dispatcher
// (so autograd, both graph executors and `mltrain profile` see them as operators):
//
//   aten::dropout(x, p, train)                  -> mltrain::dropout        (model/dropout.hpp)
//   aten::max_pool2d(aten::relu(x), 2, 2, 0, 1)  -> mltrain::relu_max_pool2d (model/batchnorm.hpp)
//
// (the relu's output used by the pool alone; kernel 2 x 2, stride 2 or default, no padding,
// dilation 1, floor). pytorch/examples' MNIST CNN spent over a third of its step in those ATen
// kernels (bernoulli_ into a float mask; the pool's int64 indices, zero-filled gradient and
// layout copies): 69 -> 46 ms a step here. Values are
// PyTorch's (the pool and its gradient bit for bit; dropout keeps each element with probability
// 1 - p from mltrain's counter-based mask, not ATen's random stream). Off the CPU, or for inputs
// the kernels do not take, each operator runs ATen's. model.script_kernels=aten leaves the graph
// as saved. Only the loaded module in memory changes: the file on disk is never rewritten.
//
// An exported program's graph (model.name: exported) gets the same two rewrites, on its nodes
// before they are planned: torch.ops.aten.dropout / dropout_ (the in-place one when nothing else
// reads its input) and relu / relu_ next to a 2 x 2 max_pool2d, in either order (they commute,
// gradients included), the value between them read by the other alone. With model.fused_batchnorm
// also aten.batch_norm (affine) followed by relu / relu_, hardswish / hardswish_ or
// silu / silu_, and
// batch_norm -> add / add_ (alpha 1; the other operand is the residual) -> relu / relu_, each
// value between them read by the next node alone, become torch.ops.mltrain.batch_norm_relu /
// batch_norm_hardswish /
// batch_norm_silu (model/batchnorm.hpp): one autograd node, two passes each way. Not bit
// for bit: their sums run in double in another order than ATen's (within ATen's own float
// rounding of a double reference, tested). With model.conv1x1_as_linear, aten.conv2d with a
// 1 x 1 kernel, stride 1, no padding, one group, on an input the archive records as 1 x 1
// (after a global pool) becomes torch.ops.mltrain.conv2d_1x1: linear on [N, C], one GEMM (the
// same products, summed in another order than oneDNN's convolution).
#include <torch/script.h>

#include <string>

namespace mltrain::formats {
struct Graph;
}

namespace mltrain::model {

struct KernelRewrites {
  int dropout = 0;               // aten::dropout nodes now mltrain::dropout
  int relu_max_pool2d = 0;       // relu -> max_pool2d pairs now mltrain::relu_max_pool2d
  int batch_norm_relu = 0;       // exported graphs: batch_norm -> relu
  int batch_norm_add_relu = 0;   // batch_norm -> add (a residual) -> relu
  int batch_norm_hardswish = 0;  // batch_norm -> hardswish
  int batch_norm_silu = 0;       // batch_norm -> silu
  int conv2d_1x1 = 0;            // conv2d 1 x 1 on a 1 x 1 input -> mltrain::conv2d_1x1
  std::string text() const;      // "2 dropout, 1 relu+max_pool2d" (or "none")
};

// Inlines every method's calls into forward and rewrites the patterns above in place.
KernelRewrites use_mltrain_kernels(torch::jit::Module& m);

// The same patterns in an exported program's nodes, rewritten in place to torch.ops.mltrain.*;
// with `batchnorm`, also the BatchNorm patterns above (model.fused_batchnorm); with `conv1x1`, a
// 1 x 1 conv2d on a 1 x 1 input (squeeze-and-excitation) as linear (model.conv1x1_as_linear).
KernelRewrites use_mltrain_kernels(formats::Graph& g, bool batchnorm, bool conv1x1);

}  // namespace mltrain::model
