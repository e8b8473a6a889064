#pragma once
// BatchNorm2d with what follows it in one autograd node: the CNN's "conv, BN, pool, ReLU" and the
// ResNet's "conv, BN, (+ shortcut), ReLU".
//
//   x = model::batchnorm_pool_relu(conv1(x), *bn1);   // == relu(max_pool2d(bn1(x), 2))
//   y = model::batchnorm_relu(conv2(y), *bn2, x);     // == relu(bn2(conv2(y)) + x)
//
// ATen runs "BN, pool, ReLU" as five kernels forward and five backward, each a pass over the
// convolution's full-size output (BatchNorm's statistics, its normalisation, the pooling with
// int64 indices, then their backwards with a zero-filled full-size gradient): 32 % of the main
// job's step. Here the forward reads x twice (statistics, then normalise-and-pool) and writes
// only the pooled output, the window position (one byte) and the chosen input; the backward
// sums over the pooled grid and writes dx in one pass. "BN, add, ReLU" likewise: two passes
// each way, the residual's gradient written in the backward's first.
//
// What it matches: PyTorch's batch_norm in training (biased variance to normalise, unbiased for
// running_var, momentum or the cumulative average, num_batches_tracked) and in evaluation;
// max_pool2d's first maximum of each window (a NaN wins), floor-sized output; relu's gradient
// where the output is > 0. Sums are in double over fixed blocks added in block order, so the
// result is the same bits on any thread count. bf16 (autocast's convolution outputs) is widened
// to float and rounded once at the end. Anything else (other dtypes, NCHW, no affine
// parameters, fp32 islands) runs ATen's operators; a second derivative (create_graph) is refused.
#include <torch/torch.h>

namespace mltrain::model {

// relu(max_pool2d(bn(x), 2)), fused where it can be (float, CPU, channels-last, affine BN).
torch::Tensor batchnorm_pool_relu(const torch::Tensor& x, torch::nn::BatchNorm2dImpl& bn);

// The same through ATen's three operators: the reference, and every case the fused path leaves.
torch::Tensor batchnorm_pool_relu_aten(const torch::Tensor& x, torch::nn::BatchNorm2dImpl& bn);

// relu(bn(x) + residual) (residual undefined: relu(bn(x))), fused where it can be (float or bf16,
// CPU, channels-last, affine BN; the residual of x's shape, dtype and layout): the ResNet's block.
torch::Tensor batchnorm_relu(const torch::Tensor& x, torch::nn::BatchNorm2dImpl& bn,
                             const torch::Tensor& residual = {});
torch::Tensor batchnorm_relu_aten(const torch::Tensor& x, torch::nn::BatchNorm2dImpl& bn,
                                  const torch::Tensor& residual = {});

// The same on the tensors aten.batch_norm takes, for an exported program's graph
// (model/script_kernels.hpp rewrites "batch_norm, [add_,] relu_" and "batch_norm, hardswish_ /
// silu_"):
// act(batch_norm(x, weight, bias, running_mean, running_var, training, momentum, eps)
// [+ residual]). In training the running statistics, when given, move by `momentum` as ATen's
// (the graph counts num_batches_tracked in a node of its own); out of training they normalise.
// Fused for float or bf16 x on the CPU, channels-last, float weight and bias (a residual with
// ReLU only, of x's shape, dtype and layout); anything else runs ATen's operators.
// Hardswish's and SiLU's backward recompute their input from x: only x is kept. SiLU's e^-y is a
// polynomial within 2 ulp of expf (ATen's: Sleef's, 1 ulp).
enum class Activation { kRelu, kHardswish, kSilu };
torch::Tensor batch_norm_act(const torch::Tensor& x, const torch::Tensor& weight,
                             const torch::Tensor& bias, const torch::Tensor& running_mean,
                             const torch::Tensor& running_var, bool training, double momentum,
                             double eps, bool cudnn_enabled, Activation act,
                             const torch::Tensor& residual = {});
torch::Tensor batch_norm_act_aten(const torch::Tensor& x, const torch::Tensor& weight,
                                  const torch::Tensor& bias, const torch::Tensor& running_mean,
                                  const torch::Tensor& running_var, bool training, double momentum,
                                  double eps, bool cudnn_enabled, Activation act,
                                  const torch::Tensor& residual = {});

// max_pool2d(relu(x), 2) (== relu(max_pool2d(x, 2)), gradients included) with no BatchNorm: a
// TorchScript graph's "ReLU, 2 x 2 max-pool" (model/script_kernels.hpp). One pass each way and a
// byte per output saved, against ATen's four passes, int64 indices and a zero-filled gradient.
// Float, CPU, channels-last; anything else runs ATen's two operators.
torch::Tensor relu_max_pool2d(const torch::Tensor& x);
torch::Tensor relu_max_pool2d_aten(const torch::Tensor& x);

}  // namespace mltrain::model
