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

}  // namespace

// Composite kernels (the dispatcher's default for a plain function): autograd runs through the
// custom functions they call.
TORCH_LIBRARY(mltrain, m) {
  m.def("dropout(Tensor input, float p, bool train) -> Tensor", &script_dropout);
  m.def("relu_max_pool2d(Tensor input) -> Tensor", &script_relu_max_pool2d);
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
  if (dropout == 0 && relu_max_pool2d == 0) return "none";
  std::string out;
  if (dropout) out += std::to_string(dropout) + " dropout";
  if (relu_max_pool2d)
    out += (out.empty() ? "" : ", ") + std::to_string(relu_max_pool2d) + " relu+max_pool2d";
  return out;
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

}  // namespace

KernelRewrites use_mltrain_kernels(formats::Graph& g) {
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
    }
  }
  std::vector<formats::Node> kept;
  kept.reserve(g.nodes.size());
  for (size_t i = 0; i < g.nodes.size(); ++i)
    if (!drop[i]) kept.push_back(std::move(g.nodes[i]));
  g.nodes = std::move(kept);
  return r;
}

}  // namespace mltrain::model
