// fp32 mm/addmm/bmm on CPU -> oneDNN's sgemm.
//
// Why: the wheel's LibTorch 2.15 sends these ops to MKL, 178-199 GFLOP/s at the MLP's shapes
// (128x784x512 .. 512^3) on two AVX-512 cores, where Debian's oneDNN sgemm reaches 219-225 with no
// layout conversion (`mltrain_bench gemm native|onednn`); the MLP's training loop runs 1.12x
// faster routed (42.3k vs 37.6k samples/s, medians of 5 interleaved rounds). Under Debian's
// LibTorch 1.13 the route replaced the reference BLAS (~2.5-6 GFLOP/s). Overriding the CPU kernels of aten::mm/addmm at the dispatcher
// reroutes every consumer at once: nn::Linear, matmul, the autograd backward of both, and
// TorchScript models, without touching model code. Anything the fast path does not cover
// (other dtypes, odd strides, empty sizes) goes to LibTorch's own structured kernels.
#include <ATen/ops/addmm_native.h>
#include <ATen/ops/bmm_native.h>
#include <ATen/ops/mm_native.h>
#include <c10/util/Exception.h>
#include <torch/library.h>
#include <torch/torch.h>

#include <dlfcn.h>

#include <memory>
#include <mutex>

#include "mltrain/core/error.hpp"
#include "mltrain/runtime/runtime.hpp"

#include <spdlog/spdlog.h>

namespace mltrain::runtime {
namespace {

// oneDNN's sgemm from Debian's libdnnl.so.2, loaded on first use with RTLD_DEEPBIND: the wheel's
// libtorch_cpu.so carries its own oneDNN v3 and exports its template statics (the call_once flags
// of gemm_info_t<float,float,float>::jit_init among them). Bound globally, Debian's libdnnl 2.6
// used those flags, found its JIT kernels "initialised" and returned dnnl_unimplemented (status 3)
// on every call; DEEPBIND makes the library resolve its own symbols first.
using SgemmFn = int (*)(char, char, int64_t, int64_t, int64_t, float, const float*, int64_t,
                        const float*, int64_t, float, float*, int64_t);
SgemmFn g_sgemm = nullptr;

bool load_sgemm() {
  static std::once_flag once;
  std::call_once(once, [] {
    void* h = dlopen("libdnnl.so.2", RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
    if (h) g_sgemm = reinterpret_cast<SgemmFn>(dlsym(h, "dnnl_sgemm"));
    if (!g_sgemm)
      spdlog::warn(
          "[runtime] kernel_route=onednn: libdnnl.so.2 could not be loaded ({}); LibTorch's own "
          "GEMM is used (fix: apt-get install libdnnl2, or runtime.kernel_route=native)",
          h ? "no dnnl_sgemm in it" : dlerror());
  });
  return g_sgemm != nullptr;
}

int dnnl_sgemm(char ta, char tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
               int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  return g_sgemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

// Describes a 2-D fp32 matrix to sgemm without copying when its strides allow it.
struct GemmOperand {
  at::Tensor keep;  // owns a contiguous copy when one was needed
  const float* data = nullptr;
  char trans = 'N';
  int64_t ld = 0;
};

GemmOperand operand(const at::Tensor& t) {
  const int64_t rows = t.size(0), cols = t.size(1);
  GemmOperand op;
  if (t.stride(1) == 1 && t.stride(0) >= std::max<int64_t>(1, cols)) {
    op.data = t.data_ptr<float>();
    op.trans = 'N';
    op.ld = t.stride(0);
  } else if (t.stride(0) == 1 && t.stride(1) >= std::max<int64_t>(1, rows)) {
    op.data = t.data_ptr<float>();  // a transposed view of a row-major matrix
    op.trans = 'T';
    op.ld = t.stride(1);
  } else {
    op.keep = t.contiguous();
    op.data = op.keep.data_ptr<float>();
    op.trans = 'N';
    op.ld = std::max<int64_t>(1, cols);
  }
  return op;
}

bool fast_path_ok(const at::Tensor& a, const at::Tensor& b) {
  return a.dim() == 2 && b.dim() == 2 && a.scalar_type() == at::kFloat &&
         b.scalar_type() == at::kFloat && a.layout() == at::kStrided &&
         b.layout() == at::kStrided && a.numel() > 0 && b.numel() > 0 && a.size(1) == b.size(0) &&
         !a.is_neg() && !b.is_neg();
}

// C[M,N] (row-major, contiguous) = alpha * A @ B + beta * C
void sgemm_into(at::Tensor& c, const at::Tensor& a, const at::Tensor& b, float alpha, float beta) {
  const int64_t M = a.size(0), K = a.size(1), N = b.size(1);
  GemmOperand A = operand(a), B = operand(b);
  int status = dnnl_sgemm(A.trans, B.trans, M, N, K, alpha, A.data, A.ld, B.data, B.ld, beta,
                          c.data_ptr<float>(), N);
  TORCH_CHECK(status == 0, "dnnl_sgemm failed with status ", status);
}

bool out_ok(const at::Tensor& out, int64_t M, int64_t N) {
  return out.scalar_type() == at::kFloat && out.layout() == at::kStrided && out.dim() == 2 &&
         out.size(0) == M && out.size(1) == N && out.is_contiguous();
}

// LibTorch's own structured CPU kernel, run with a caller-supplied output.
template <class Kernel>
struct NativeOut : Kernel {
  explicit NativeOut(at::Tensor& out) : out_(out) {}
  const at::Tensor& maybe_get_output(int64_t) override { return out_; }
  // LibTorch up to 2.1x passed named-tensor dimension names as a last argument; 2.15 dropped
  // named tensors (and ATen/core/Dimname.h with them). The GPU machines' torch is older.
#if __has_include(<ATen/core/Dimname.h>)
#define MLTRAIN_META_NAMES , at::DimnameList
#else
#define MLTRAIN_META_NAMES
#endif
  void set_output_raw_strided(int64_t, at::IntArrayRef sizes, at::IntArrayRef,
                              at::TensorOptions MLTRAIN_META_NAMES) override {
    out_.resize_(sizes);
  }
  void set_output_strided(int64_t, at::IntArrayRef sizes, at::IntArrayRef,
                          at::TensorOptions MLTRAIN_META_NAMES) override {
    out_.resize_(sizes);
  }
#undef MLTRAIN_META_NAMES
  at::Tensor& out_;
};

at::Tensor& native_mm_out(const at::Tensor& self, const at::Tensor& mat2, at::Tensor& out) {
  NativeOut<at::native::structured_mm_out_cpu> op(out);
  op.meta(self, mat2);
  op.impl(self, mat2, out);
  return out;
}

at::Tensor& native_addmm_out(const at::Tensor& self, const at::Tensor& m1, const at::Tensor& m2,
                             const at::Scalar& beta, const at::Scalar& alpha, at::Tensor& out) {
  NativeOut<at::native::structured_addmm_out_cpu> op(out);
  op.meta(self, m1, m2, beta, alpha);
  op.impl(self, m1, m2, beta, alpha, out);
  return out;
}

at::Tensor& route_mm_out(const at::Tensor& self, const at::Tensor& mat2, at::Tensor& out) {
  if (!fast_path_ok(self, mat2)) return native_mm_out(self, mat2, out);
  const int64_t M = self.size(0), N = mat2.size(1);
  if (!out_ok(out, M, N)) {
    if (out.numel() == 0 && out.scalar_type() == at::kFloat) out.resize_({M, N});
    if (!out_ok(out, M, N)) return native_mm_out(self, mat2, out);
  }
  sgemm_into(out, self, mat2, 1.0f, 0.0f);
  return out;
}

at::Tensor route_mm(const at::Tensor& self, const at::Tensor& mat2) {
  if (!fast_path_ok(self, mat2)) {
    auto out = at::empty({0}, self.options());
    return native_mm_out(self, mat2, out);
  }
  auto out = at::empty({self.size(0), mat2.size(1)}, self.options());
  sgemm_into(out, self, mat2, 1.0f, 0.0f);
  return out;
}

at::Tensor& route_addmm_out(const at::Tensor& self, const at::Tensor& m1, const at::Tensor& m2,
                            const at::Scalar& beta, const at::Scalar& alpha, at::Tensor& out) {
  const bool same = out.is_same(self);
  if (!fast_path_ok(m1, m2) || self.scalar_type() != at::kFloat || same)
    return native_addmm_out(self, m1, m2, beta, alpha, out);
  const int64_t M = m1.size(0), N = m2.size(1);
  if (!out_ok(out, M, N)) {
    if (out.numel() == 0 && out.scalar_type() == at::kFloat) out.resize_({M, N});
    if (!out_ok(out, M, N)) return native_addmm_out(self, m1, m2, beta, alpha, out);
  }
  const float b = beta.toFloat();
  if (b != 0.0f)
    out.copy_(self.expand({M, N}));  // beta == 0: self is ignored, NaNs too (torch semantics)
  sgemm_into(out, m1, m2, alpha.toFloat(), b);
  return out;
}

at::Tensor route_addmm(const at::Tensor& self, const at::Tensor& m1, const at::Tensor& m2,
                       const at::Scalar& beta, const at::Scalar& alpha) {
  auto out = at::empty({0}, m1.options());
  return route_addmm_out(self, m1, m2, beta, alpha, out);
}

at::Tensor& route_addmm_(at::Tensor& self, const at::Tensor& m1, const at::Tensor& m2,
                         const at::Scalar& beta, const at::Scalar& alpha) {
  if (fast_path_ok(m1, m2) && out_ok(self, m1.size(0), m2.size(1))) {
    sgemm_into(self, m1, m2, alpha.toFloat(), beta.toFloat());
    return self;
  }
  auto tmp = self.clone();
  native_addmm_out(tmp, m1, m2, beta, alpha, self);
  return self;
}

// Batched matmul (attention's q @ k^T and att @ v, and their backward): one sgemm per matrix,
// the batch split over LibTorch's threads (oneDNN runs each call single-threaded inside them).
bool bmm_fast_path_ok(const at::Tensor& a, const at::Tensor& b) {
  return a.dim() == 3 && b.dim() == 3 && a.size(0) == b.size(0) && a.size(2) == b.size(1) &&
         a.scalar_type() == at::kFloat && b.scalar_type() == at::kFloat &&
         a.layout() == at::kStrided && b.layout() == at::kStrided && a.numel() > 0 &&
         b.numel() > 0 && !a.is_neg() && !b.is_neg() && !a.is_conj() && !b.is_conj();
}

// How sgemm reads every matrix of a 3-D batch: row-major ('N') or a transposed view ('T') with
// one leading dimension; a batch with neither layout is made contiguous once.
struct BatchOperand {
  at::Tensor keep;
  const float* data = nullptr;
  int64_t batch_stride = 0, ld = 0;
  char trans = 'N';
};

BatchOperand batch_operand(const at::Tensor& t) {
  const int64_t rows = t.size(1), cols = t.size(2);
  BatchOperand op;
  op.data = t.data_ptr<float>();
  op.batch_stride = t.stride(0);
  if (t.stride(2) == 1 && t.stride(1) >= std::max<int64_t>(1, cols)) {
    op.ld = t.stride(1);
  } else if (t.stride(1) == 1 && t.stride(2) >= std::max<int64_t>(1, rows)) {
    op.trans = 'T';
    op.ld = t.stride(2);
  } else {
    op.keep = t.contiguous();
    op.data = op.keep.data_ptr<float>();
    op.batch_stride = rows * cols;
    op.ld = std::max<int64_t>(1, cols);
  }
  return op;
}

void bmm_into(at::Tensor& out, const at::Tensor& a, const at::Tensor& b) {
  const int64_t batch = a.size(0), M = a.size(1), K = a.size(2), N = b.size(2);
  const BatchOperand A = batch_operand(a), B = batch_operand(b);
  float* c = out.data_ptr<float>();
  // One product after the other, each threaded by oneDNN itself: what the at::parallel_for written
  // here before did (it ran serially; runtime::parallel_for over the batch is unmeasured).
  for (int64_t i = 0; i < batch; ++i) {
    const int status = dnnl_sgemm(A.trans, B.trans, M, N, K, 1.0f, A.data + i * A.batch_stride,
                                  A.ld, B.data + i * B.batch_stride, B.ld, 0.0f, c + i * M * N, N);
    TORCH_CHECK(status == 0, "dnnl_sgemm failed with status ", status);
  }
}

at::Tensor& native_bmm_out(const at::Tensor& self, const at::Tensor& mat2, at::Tensor& out) {
  NativeOut<at::native::structured_bmm_out_cpu> op(out);
  op.meta(self, mat2);
  op.impl(self, mat2, out);
  return out;
}

at::Tensor& route_bmm_out(const at::Tensor& self, const at::Tensor& mat2, at::Tensor& out) {
  const int64_t B = self.size(0), M = self.size(1), N = mat2.size(2);
  if (!bmm_fast_path_ok(self, mat2) || out.scalar_type() != at::kFloat)
    return native_bmm_out(self, mat2, out);
  if (out.sizes() != at::IntArrayRef({B, M, N})) out.resize_({B, M, N});
  if (!out.is_contiguous()) return native_bmm_out(self, mat2, out);
  bmm_into(out, self, mat2);
  return out;
}

at::Tensor route_bmm(const at::Tensor& self, const at::Tensor& mat2) {
  if (!bmm_fast_path_ok(self, mat2)) {
    auto out = at::empty({0}, self.options());
    return native_bmm_out(self, mat2, out);
  }
  auto out = at::empty({self.size(0), self.size(1), mat2.size(2)}, self.options());
  bmm_into(out, self, mat2);
  return out;
}

// Re-registering a kernel for an existing (op, dispatch key) makes LibTorch warn once per op; that
// warning is expected here and would only confuse users, so it is swallowed during registration.
struct QuietHandler : c10::WarningHandler {
  void process(const c10::Warning&) override {}
};

std::mutex g_mutex;
std::unique_ptr<torch::Library> g_library;
std::string g_route = "native";

}  // namespace

void set_kernel_route(const std::string& route) {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (route != "onednn" && route != "native")
    throw ConfigError("runtime.kernel_route", "unknown kernel route '" + route + "'",
                      "use onednn or native");
  if (route == g_route) return;
  if (route == "onednn" && !load_sgemm()) return;  // stays native; load_sgemm said why, once
  if (route == "native") {
    g_library.reset();  // dropping the registrations restores LibTorch's own kernels
  } else {
    QuietHandler quiet;
    c10::WarningUtils::WarningHandlerGuard guard(&quiet);
    g_library = std::make_unique<torch::Library>(torch::Library::IMPL, "aten",
                                                 c10::DispatchKey::CPU, __FILE__, __LINE__);
    g_library->impl("mm", TORCH_FN(route_mm));
    g_library->impl("mm.out", TORCH_FN(route_mm_out));
    g_library->impl("addmm", TORCH_FN(route_addmm));
    g_library->impl("addmm.out", TORCH_FN(route_addmm_out));
    g_library->impl("addmm_", TORCH_FN(route_addmm_));
    g_library->impl("bmm", TORCH_FN(route_bmm));
    g_library->impl("bmm.out", TORCH_FN(route_bmm_out));
  }
  g_route = route;
}

std::string kernel_route() {
  std::lock_guard<std::mutex> lock(g_mutex);
  return g_route;
}

}  // namespace mltrain::runtime
