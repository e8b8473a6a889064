#include "mltrain/model/script_kernels.hpp"

#include <torch/csrc/jit/passes/constant_propagation.h>
#include <torch/csrc/jit/passes/dead_code_elimination.h>
#include <torch/csrc/jit/passes/inliner.h>
#include <torch/library.h>

#include <map>
#include <optional>
#include <set>
#include <vector>

#include "mltrain/formats/pt2.hpp"
#include "mltrain/model/batchnorm.hpp"
#include "mltrain/model/dropout.hpp"

namespace {

at::Tensor script_dropout(const at::Tensor& x, double p, bool train) {
  return mltrain::model::dropout(x, p, train);
}

at::Tensor script_relu_max_pool2d(const at::Tensor& x) {
  return mltrain::model::relu_max_pool2d(x);
}

const at::Tensor& or_none(const std::optional<at::Tensor>& t) {
  static const at::Tensor none;
  return t ? *t : none;
}

at::Tensor graph_batch_norm_relu(const at::Tensor& input, const std::optional<at::Tensor>& weight,
                                 const std::optional<at::Tensor>& bias,
                                 const std::optional<at::Tensor>& running_mean,
                                 const std::optional<at::Tensor>& running_var, bool training,
                                 double momentum, double eps, bool cudnn_enabled,
                                 const std::optional<at::Tensor>& residual) {
  return mltrain::model::batch_norm_act(
      input, or_none(weight), or_none(bias), or_none(running_mean), or_none(running_var), training,
      momentum, eps, cudnn_enabled, mltrain::model::Activation::kRelu, or_none(residual));
}

template <mltrain::model::Activation act>
at::Tensor graph_batch_norm_act(const at::Tensor& input, const std::optional<at::Tensor>& weight,
                                const std::optional<at::Tensor>& bias,
                                const std::optional<at::Tensor>& running_mean,
                                const std::optional<at::Tensor>& running_var, bool training,
                                double momentum, double eps, bool cudnn_enabled) {
  return mltrain::model::batch_norm_act(input, or_none(weight), or_none(bias),
                                        or_none(running_mean), or_none(running_var), training,
                                        momentum, eps, cudnn_enabled, act);
}

// conv2d of a [N, C, 1, 1] input with a [O, C, 1, 1] kernel, stride 1, no padding, one group
// (a squeeze-and-excitation block's two convolutions, after its global pool): the same sums as
// linear on [N, C], which runs as one GEMM where oneDNN's convolution set-up costs more than
// the arithmetic (MobileNetV3's SE convolutions: 1.6 ms each way at batch 128). Shapes the
// rewrite assumed but the call does not have run ATen's conv2d.
at::Tensor graph_conv2d_1x1(const at::Tensor& input, const at::Tensor& weight,
                            const std::optional<at::Tensor>& bias) {
  if (input.dim() != 4 || input.size(2) != 1 || input.size(3) != 1 || weight.dim() != 4 ||
      weight.size(2) != 1 || weight.size(3) != 1 || weight.size(1) != input.size(1))
    return at::conv2d(input, weight, or_none(bias));
  return at::linear(input.flatten(1), weight.flatten(1), or_none(bias))
      .view({input.size(0), weight.size(0), 1, 1});
}

}  // namespace

// Composite kernels (the dispatcher's default for a plain function): autograd runs through the
// custom functions they call.
TORCH_LIBRARY(mltrain, m) {
  m.def("dropout(Tensor input, float p, bool train) -> Tensor", &script_dropout);
  m.def("relu_max_pool2d(Tensor input) -> Tensor", &script_relu_max_pool2d);
  // aten.batch_norm's arguments (its names: an exported graph's nodes pass them by name), then
  // the residual added before the ReLU. The names contain "batch_norm" and "training": the
  // exported-program runner turns `training` off for evaluation as it does for aten.batch_norm.
  m.def(
      "batch_norm_relu(Tensor input, Tensor? weight, Tensor? bias, Tensor? running_mean, "
      "Tensor? running_var, bool training, float momentum, float eps, bool cudnn_enabled, "
      "Tensor? residual=None) -> Tensor",
      &graph_batch_norm_relu);
  m.def(
      "batch_norm_hardswish(Tensor input, Tensor? weight, Tensor? bias, Tensor? running_mean, "
      "Tensor? running_var, bool training, float momentum, float eps, bool cudnn_enabled) -> "
      "Tensor",
      &graph_batch_norm_act<mltrain::model::Activation::kHardswish>);
  m.def(
      "batch_norm_silu(Tensor input, Tensor? weight, Tensor? bias, Tensor? running_mean, "
      "Tensor? running_var, bool training, float momentum, float eps, bool cudnn_enabled) -> "
      "Tensor",
      &graph_batch_norm_act<mltrain::model::Activation::kSilu>);
  m.def("conv2d_1x1(Tensor input, Tensor weight, Tensor? bias=None) -> Tensor", &graph_conv2d_1x1);
}

namespace mltrain::model {
namespace {

using torch::jit::Node;
using torch::jit::Value;

std::optional<std::vector<int64_t>> int_list(Value* v) {
  const auto iv = torch::jit::toIValue(v);
  if (!iv || !iv->isIntList()) return std::nullopt;
  return iv->toIntVector();
}

bool is_pair(const std::optional<std::vector<int64_t>>& l, int64_t want) {
  return l && l->size() == 2 && (*l)[0] == want && (*l)[1] == want;
}

// aten::max_pool2d(self, kernel_size, stride, padding, dilation, ceil_mode) with the 2 x 2 pool
// the fused kernel computes.
bool pool_2x2(Node* n) {
  if (n->inputs().size() != 6) return false;
  const auto stride = int_list(n->input(2));
  const auto ceil = torch::jit::toIValue(n->input(5));
  return is_pair(int_list(n->input(1)), 2) && (is_pair(stride, 2) || (stride && stride->empty())) &&
         is_pair(int_list(n->input(3)), 0) && is_pair(int_list(n->input(4)), 1) && ceil &&
         ceil->isBool() && !ceil->toBool();
}

Node* replace(torch::jit::Graph& g, Node* old, const char* op, at::ArrayRef<Value*> inputs) {
  torch::jit::WithInsertPoint guard(old);
  Node* n = g.insertNode(g.create(c10::Symbol::fromQualString(op), inputs));
  n->output()->setType(old->output()->type());
  n->copyMetadata(old);
  old->output()->replaceAllUsesWith(n->output());
  return n;
}

void rewrite(torch::jit::Graph& g, KernelRewrites& r) {
  std::vector<Node*> dropouts, pools;
  for (Node* n : g.nodes())  // top level only: a block inside if/loop keeps ATen's
    if (n->kind() == c10::aten::dropout && n->inputs().size() == 3)
      dropouts.push_back(n);
    else if (n->kind() == c10::aten::max_pool2d && pool_2x2(n) &&
             n->input(0)->node()->kind() == c10::aten::relu && n->input(0)->uses().size() == 1)
      pools.push_back(n);
  for (Node* n : dropouts) {
    replace(g, n, "mltrain::dropout", n->inputs());
    n->destroy();
    ++r.dropout;
  }
  for (Node* n : pools) {
    Node* relu = n->input(0)->node();
    replace(g, n, "mltrain::relu_max_pool2d", {relu->input(0)});
    n->destroy();
    relu->destroy();
    ++r.relu_max_pool2d;
  }
}

}  // namespace

std::string KernelRewrites::text() const {
  std::string out;
  for (const auto& [count, what] : {std::pair{dropout, "dropout"},
                                    {relu_max_pool2d, "relu+max_pool2d"},
                                    {batch_norm_relu, "batch_norm+relu"},
                                    {batch_norm_add_relu, "batch_norm+add+relu"},
                                    {batch_norm_hardswish, "batch_norm+hardswish"},
                                    {batch_norm_silu, "batch_norm+silu"},
                                    {conv2d_1x1, "conv2d 1x1 as linear"}})
    if (count) out += (out.empty() ? "" : ", ") + std::to_string(count) + " " + what;
  return out.empty() ? "none" : out;
}

KernelRewrites use_mltrain_kernels(torch::jit::Module& m) {
  KernelRewrites r;
  if (!m.find_method("forward")) return r;
  std::shared_ptr<torch::jit::Graph> g = m.get_method("forward").graph();
  // What either graph executor does first: calls inlined, constant branches folded (F.relu's
  // `inplace`, F.dropout's), so the patterns are plain nodes.
  torch::jit::Inline(*g);
  torch::jit::ConstantPropagation(g);
  rewrite(*g, r);
  torch::jit::EliminateDeadCode(g);
  return r;
}

namespace {

// ---- exported programs: the same patterns on formats::Graph nodes ----

using formats::Argument;

constexpr const char* kAten = "torch.ops.aten.";

bool is_op(const formats::Node& n, const char* name) {
  return n.target == std::string(kAten) + name;
}

// The node's argument `name`, or the one at `pos` in an archive that names none; null if absent
// (the schema's default).
const Argument* arg_of(const formats::Node& n, const std::string& name, size_t pos) {
  for (const auto& a : n.inputs)
    if (a.name == name) return &a.arg;
  if (pos < n.inputs.size() && n.inputs[pos].name.empty()) return &n.inputs[pos].arg;
  return nullptr;
}

bool ints_are(const Argument* a, int64_t want, bool absent_ok, bool empty_ok = false) {
  if (!a) return absent_ok;
  if (a->kind == Argument::kInt) return a->i == want;
  if (a->kind != Argument::kInts) return false;
  if (a->ints.empty()) return empty_ok;
  for (int64_t v : a->ints)
    if (v != want) return false;
  return a->ints.size() <= 2;
}

// aten.max_pool2d.default with the 2 x 2 pool the fused kernel computes: kernel 2, stride 2 or
// the default (the kernel), no padding, dilation 1, floor.
bool pool_2x2(const formats::Node& n) {
  if (!is_op(n, "max_pool2d.default")) return false;
  const Argument* ceil = arg_of(n, "ceil_mode", 5);
  return ints_are(arg_of(n, "kernel_size", 1), 2, false) &&
         ints_are(arg_of(n, "stride", 2), 2, true, true) &&
         ints_are(arg_of(n, "padding", 3), 0, true) &&
         ints_are(arg_of(n, "dilation", 4), 1, true) &&
         (!ceil || (ceil->kind == Argument::kBool && !ceil->b));
}

bool is_relu(const formats::Node& n) {
  return is_op(n, "relu.default") || is_op(n, "relu_.default");
}

// The one tensor a node reads as its first argument ("" if it is not a tensor).
std::string first_tensor(const formats::Node& n) {
  if (n.inputs.empty() || n.inputs[0].arg.kind != Argument::kTensor) return "";
  return n.inputs[0].arg.names.at(0);
}

std::string single_output(const formats::Node& n) {
  if (n.outputs.size() != 1 || n.outputs[0].kind != Argument::kTensor) return "";
  return n.outputs[0].names.at(0);
}

bool is_hardswish(const formats::Node& n) {
  return is_op(n, "hardswish.default") || is_op(n, "hardswish_.default");
}

bool is_silu(const formats::Node& n) {
  return is_op(n, "silu.default") || is_op(n, "silu_.default");
}

// add / add_ of two tensors with alpha 1.
bool is_add(const formats::Node& n) {
  if (!is_op(n, "add.Tensor") && !is_op(n, "add_.Tensor")) return false;
  const Argument* alpha = arg_of(n, "alpha", 2);
  return !alpha || (alpha->kind == Argument::kInt && alpha->i == 1) ||
         (alpha->kind == Argument::kFloat && alpha->f == 1.0);
}

// An add's self and other, "" where one is not a tensor.
std::pair<std::string, std::string> add_operands(const formats::Node& n) {
  const Argument* self = arg_of(n, "self", 0);
  const Argument* other = arg_of(n, "other", 1);
  auto name = [](const Argument* a) {
    return a && a->kind == Argument::kTensor && !a->names.empty() ? a->names[0] : std::string();
  };
  return {name(self), name(other)};
}

// aten.batch_norm.default with its affine parameters given (the fused kernels' BatchNorm).
bool batch_norm_2d(const formats::Node& n) {
  if (!is_op(n, "batch_norm.default")) return false;
  const Argument* w = arg_of(n, "weight", 1);
  const Argument* b = arg_of(n, "bias", 2);
  return w && b && w->kind == Argument::kTensor && b->kind == Argument::kTensor;
}

// aten.conv2d.default with a 1 x 1 kernel on a 1 x 1 input (the archive's shapes: static 1s),
// stride 1, no padding, dilation 1, one group.
bool conv_on_one_pixel(const formats::Node& n, const formats::Graph& g) {
  if (!is_op(n, "conv2d.default")) return false;
  const Argument* in = arg_of(n, "input", 0);
  const Argument* w = arg_of(n, "weight", 1);
  if (!in || !w || in->kind != Argument::kTensor || w->kind != Argument::kTensor) return false;
  auto one_by_one = [&](const Argument* a) {
    const auto m = g.tensor_values.find(a->names.at(0));
    if (m == g.tensor_values.end() || m->second.sizes.size() != 4) return false;
    for (int d : {2, 3})
      if (m->second.sizes[d].is_symbol || m->second.sizes[d].value != 1) return false;
    return true;
  };
  const Argument* groups = arg_of(n, "groups", 6);
  return one_by_one(in) && one_by_one(w) && ints_are(arg_of(n, "stride", 3), 1, true) &&
         ints_are(arg_of(n, "padding", 4), 0, true) &&
         ints_are(arg_of(n, "dilation", 5), 1, true) &&
         (!groups || (groups->kind == Argument::kInt && groups->i == 1));
}

// An in-place ATen operator (its name ends in '_': add_, relu_, copy_ ...).
bool writes_in_place(const formats::Node& n) {
  if (n.target.rfind(kAten, 0) != 0) return false;
  const std::string op = n.target.substr(std::string(kAten).size());
  const auto dot = op.find('.');
  const std::string base = op.substr(0, dot);
  return !base.empty() && base.back() == '_';
}

}  // namespace

KernelRewrites use_mltrain_kernels(formats::Graph& g, bool batchnorm, bool conv1x1) {
  KernelRewrites r;
  // Readers of each value (graph outputs count as readers that cannot be rewritten).
  std::map<std::string, int> readers;
  for (const auto& n : g.nodes)
    for (const auto& in : n.inputs)
      for (const auto& name : in.arg.names) ++readers[name];
  std::set<std::string> graph_out, graph_in;
  for (const auto& o : g.outputs)
    for (const auto& name : o.names) graph_out.insert(name);
  for (const auto& i : g.inputs)
    for (const auto& name : i.names) graph_in.insert(name);
  // A value read by exactly one node and not an output of the graph: it may be folded away.
  auto private_to_one = [&](const std::string& v) {
    return !v.empty() && readers[v] == 1 && !graph_out.count(v) && !graph_in.count(v);
  };
  std::map<std::string, size_t> producer;
  for (size_t i = 0; i < g.nodes.size(); ++i)
    if (const auto out = single_output(g.nodes[i]); !out.empty()) producer[out] = i;
  std::map<std::string, size_t> sole_reader;  // the reader of each value read once
  for (size_t i = 0; i < g.nodes.size(); ++i)
    for (const auto& in : g.nodes[i].inputs)
      for (const auto& name : in.arg.names)
        if (readers[name] == 1) sole_reader[name] = i;
  std::vector<bool> drop(g.nodes.size(), false);
  auto fused_pool = [](formats::Node& at, const std::string& input) {
    formats::NamedArgument a;
    a.name = "input";
    a.arg.kind = Argument::kTensor;
    a.arg.names = {input};
    at.inputs = {a};
    at.target = "torch.ops.mltrain.relu_max_pool2d.default";
  };
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    formats::Node& n = g.nodes[i];
    const std::string in = first_tensor(n);
    if (conv1x1 && conv_on_one_pixel(n, g)) {
      // The same arguments, less those a 1 x 1 convolution with its defaults ignores.
      std::vector<formats::NamedArgument> args;
      for (size_t k = 0; k < n.inputs.size() && k < 3; ++k)
        if (n.inputs[k].name.empty() || n.inputs[k].name == "input" ||
            n.inputs[k].name == "weight" || n.inputs[k].name == "bias")
          args.push_back(n.inputs[k]);
      n.inputs = std::move(args);
      n.target = "torch.ops.mltrain.conv2d_1x1.default";
      ++r.conv2d_1x1;
      continue;
    }
    if (is_op(n, "dropout.default") || (is_op(n, "dropout_.default") && private_to_one(in))) {
      // aten.dropout(input, p, train) -> mltrain.dropout(input, p, train): the same arguments.
      n.target = "torch.ops.mltrain.dropout.default";
      for (auto& a : n.inputs)
        if (a.name == "self") a.name = "input";
      ++r.dropout;
      continue;
    }
    if (in.empty() || !producer.count(in) || !private_to_one(in)) continue;
    formats::Node& prev = g.nodes[producer[in]];
    if (drop[producer[in]]) continue;
    const std::string prev_in = first_tensor(prev);
    // relu -> pool: the pool reads the relu's output alone; an in-place relu_ must also be the
    // only reader of its input (it writes into it).
    if (pool_2x2(n) && is_relu(prev) && (is_op(prev, "relu.default") || private_to_one(prev_in)) &&
        !prev_in.empty()) {
      fused_pool(n, prev_in);
      drop[producer[in]] = true;
      ++r.relu_max_pool2d;
      continue;
    }
    // pool -> relu: the same value (max and ReLU commute); the node keeps the relu's output.
    if (is_relu(n) && pool_2x2(prev) && !prev_in.empty()) {
      fused_pool(n, prev_in);
      n.module_stack = prev.module_stack.empty() ? n.module_stack : prev.module_stack;
      drop[producer[in]] = true;
      ++r.relu_max_pool2d;
      continue;
    }
    if (!batchnorm || !(is_relu(n) || is_hardswish(n) || is_silu(n))) continue;
    // A ReLU whose output a 2 x 2 max-pool alone reads keeps the pool's rewrite (exact, and
    // the larger win: the pool's int64 indices and zero-filled gradient go).
    if (const auto out = single_output(n); is_relu(n) && private_to_one(out) &&
                                           sole_reader.count(out) &&
                                           pool_2x2(g.nodes[sole_reader[out]]))
      continue;
    // batch_norm -> relu / hardswish, and batch_norm -> add -> relu (the residual block): the
    // node becomes mltrain.batch_norm_<act> with the batch_norm's arguments (and the add's other
    // operand as the residual); the batch_norm (and the add) go.
    const size_t at_prev = producer[in];
    size_t at_bn = at_prev;
    std::string residual;
    if (is_relu(n) && is_add(prev)) {
      const auto [self, other] = add_operands(prev);
      // add_ writes into its self: only that operand may be the batch_norm's private output.
      for (const auto& [mine, theirs] :
           {std::pair{self, other},
            is_op(prev, "add.Tensor") ? std::pair{other, self} : std::pair{std::string(), self}})
        if (!mine.empty() && !theirs.empty() && mine != theirs && producer.count(mine) &&
            private_to_one(mine) && !drop[producer[mine]] &&
            batch_norm_2d(g.nodes[producer[mine]])) {
          at_bn = producer[mine];
          residual = theirs;
          break;
        }
      if (residual.empty()) continue;
    } else if (!batch_norm_2d(prev)) {
      continue;
    }
    formats::Node& bn = g.nodes[at_bn];
    // Nothing between the batch_norm and this node may write in place into what the fused node
    // reads (it reads them later than the batch_norm and the add did).
    std::set<std::string> reads;
    for (const auto& a : bn.inputs)
      for (const auto& name : a.arg.names) reads.insert(name);
    if (!residual.empty()) reads.insert(residual);
    bool clobbered = false;
    for (size_t k = std::min(at_bn, at_prev) + 1; k < i && !clobbered; ++k)
      clobbered = writes_in_place(g.nodes[k]) && reads.count(first_tensor(g.nodes[k]));
    if (clobbered) continue;
    const bool relu = is_relu(n), silu = is_silu(n);
    std::vector<formats::NamedArgument> args;
    for (const auto& a : bn.inputs) args.push_back(a);
    if (!residual.empty()) {
      formats::NamedArgument a;
      a.name = "residual";
      a.arg.kind = Argument::kTensor;
      a.arg.names = {residual};
      args.push_back(a);
    }
    n.inputs = std::move(args);
    n.target = relu   ? "torch.ops.mltrain.batch_norm_relu.default"
               : silu ? "torch.ops.mltrain.batch_norm_silu.default"
                      : "torch.ops.mltrain.batch_norm_hardswish.default";
    if (!bn.module_stack.empty()) n.module_stack = bn.module_stack;
    drop[at_bn] = true;
    drop[at_prev] = true;
    ++(silu               ? r.batch_norm_silu
       : !relu            ? r.batch_norm_hardswish
       : residual.empty() ? r.batch_norm_relu
                          : r.batch_norm_add_relu);
  }
  std::vector<formats::Node> kept;
  kept.reserve(g.nodes.size());
  for (size_t i = 0; i < g.nodes.size(); ++i)
    if (!drop[i]) kept.push_back(std::move(g.nodes[i]));
  g.nodes = std::move(kept);
  return r;
}

}  // namespace mltrain::model
