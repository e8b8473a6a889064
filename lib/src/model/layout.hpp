#pragma once
// Channels-last strides that LibTorch also *recognises* as channels-last. With one channel
// (the first conv's input and weights, every depthwise weight [C, 1, k, k]), NCHW and NHWC
// strides coincide, so contiguous(ChannelsLast) returns the tensor unchanged and
// suggest_memory_format() still says NCHW; the convolution then emits NCHW and the BatchNorm and
// pooling after it run their slow NCHW kernels (measured with `mltrain profile`: 3.5 and 6.5 ms of
// the CNN's 62 ms step; torchvision's MobileNetV3-small as an exported program 2.5x slower). An
// explicit channels-last copy avoids that.
#include <torch/torch.h>

namespace mltrain::model {

inline torch::Tensor channels_last(const torch::Tensor& t) {
  if (t.dim() != 4 || t.suggest_memory_format() == at::MemoryFormat::ChannelsLast) return t;
  return torch::empty_like(t, t.options(), at::MemoryFormat::ChannelsLast).copy_(t);
}

}  // namespace mltrain::model
