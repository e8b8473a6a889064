#include "mltrain/model/script_kernels.hpp"

#include <torch/csrc/jit/passes/constant_propagation.h>
#include <torch/csrc/jit/passes/dead_code_elimination.h>
#include <torch/csrc/jit/passes/inliner.h>
#include <torch/library.h>

#include <optional>
#include <vector>

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

void rewrite(torch::jit::Graph& g, ScriptRewrites& r) {
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

std::string ScriptRewrites::text() const {
  if (dropout == 0 && relu_max_pool2d == 0) return "none";
  std::string out;
  if (dropout) out += std::to_string(dropout) + " dropout";
  if (relu_max_pool2d)
    out += (out.empty() ? "" : ", ") + std::to_string(relu_max_pool2d) + " relu+max_pool2d";
  return out;
}

ScriptRewrites use_mltrain_kernels(torch::jit::Module& m) {
  ScriptRewrites r;
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

}  // namespace mltrain::model
