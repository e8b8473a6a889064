#pragma once
// BatchNorm2d, 2 x 2 max-pooling and ReLU in one autograd node: the CNN's "conv, BN, pool, ReLU".
//
//   x = model::batchnorm_pool_relu(conv1(x), *bn1);   // == relu(max_pool2d(bn1(x), 2))
//
// ATen runs the three as five kernels forward and five backward, each a pass over the
// convolution's full-size output (BatchNorm's statistics, its normalisation, the pooling with
// int64 indices, then their backwards with a zero-filled full-size gradient): 32 % of the main
// job's step. Here the forward reads x twice (statistics, then normalise-and-pool) and writes
// only the pooled output, the window position (one byte) and the chosen input; the backward
// sums over the pooled grid and writes dx in one pass.
//
// What it matches: PyTorch's batch_norm in training (biased variance to normalise, unbiased for
// running_var, momentum or the cumulative average, num_batches_tracked) and in evaluation;
// max_pool2d's first maximum of each window (a NaN wins), floor-sized output; relu's gradient
// where the output is > 0. Sums are in double over fixed blocks added in block order, so the
// result is the same bits on any thread count. Anything else (other dtypes, NCHW, no affine
// parameters, autocast islands, a double backward) runs the ATen composite instead.
#include <torch/torch.h>

namespace mltrain::model {

// relu(max_pool2d(bn(x), 2)), fused where it can be (float, CPU, channels-last, affine BN).
torch::Tensor batchnorm_pool_relu(const torch::Tensor& x, torch::nn::BatchNorm2dImpl& bn);

// The same through ATen's three operators: the reference, and every case the fused path leaves.
torch::Tensor batchnorm_pool_relu_aten(const torch::Tensor& x, torch::nn::BatchNorm2dImpl& bn);

}  // namespace mltrain::model
