// A decoder-only transformer (GPT-2 layout, as Karpathy's nanoGPT): token and position embeddings,
// n_layer pre-norm blocks of causal self-attention and a GELU MLP, a final LayerNorm and an
// output layer tied to the token embedding. Init: N(0, 0.02) weights, zero biases, residual
// projections N(0, 0.02 / sqrt(2 n_layer)) (GPT-2 paper, section 2.3).
//
// Parameter names: wte.weight, wpe.weight, h.<i>.{ln_1,attn.c_attn,attn.c_proj,ln_2,mlp.c_fc,
// mlp.c_proj}.{weight,bias}, ln_f.{weight,bias}; the tied output layer has no name of its own.
//
// model.share: gated (the field guide's SmartShare) keeps one base weight per shape, shared by
// every block: share.{c_attn,attn_proj,c_fc,mlp_proj} ([3C,C], [C,C], [4C,C], [C,4C], four
// distinct shapes). Block i's matrix is sigmoid(h.<i>.<layer>.gate) x base, the gate a learned
// scalar per block and matrix (logit 0 at init). The bases start at twice the unshared std, so
// every effective weight starts at the unshared model's std. Biases and norms stay per block.
//
// model.share: gated_input (the guide's gate as it wrote it, sigmoid(Linear(x.mean(...)))[layer])
// makes the gate depend on the input: each base has a gate layer share.gate.<base>.{weight,bias}
// ([n_layer, in], [n_layer]) and block i scales base x's output at position t by
// sigmoid(w_i . mean(x_1..x_t) + b_i). The mean runs over the positions up to t, not the whole
// window: a whole-window mean would show every position the tokens after it, which a causal
// language model must not see. Gate weights and biases start at 0 (sigmoid 1/2, as gated).
#include "gpt.hpp"

#include <cmath>

#include <spdlog/fmt/fmt.h>

#include "islands.hpp"
#include "mltrain/core/error.hpp"
#include "mltrain/model/dropout.hpp"
#include "recompute.hpp"

namespace mltrain::model {
namespace nn = torch::nn;
namespace F = torch::nn::functional;

namespace {

// LayerNorm with an optional bias (LibTorch's has both or neither).
struct NormImpl : nn::Module {
  torch::Tensor weight, bias;
  int64_t width;
  NormImpl(int64_t n, bool with_bias) : width(n) {
    weight = register_parameter("weight", torch::ones({n}));
    if (with_bias) bias = register_parameter("bias", torch::zeros({n}));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    return torch::layer_norm(x, {width}, weight, bias, 1e-5);
  }
};
TORCH_MODULE(Norm);

// One shared weight of model.share: its base and, for gated_input, the gate layer's weight
// [n_layer, in] and bias [n_layer]; all undefined when not sharing.
struct Shared {
  torch::Tensor base, gate_w, gate_b;
};

// A Linear layer (y = x W^T + b) whose W is its own parameter; given a shared base, sigmoid(gate)
// x base (model.share: gated), or the base's output scaled per position by this layer's row of the
// input gate (gated_input).
struct DenseImpl : nn::Module {
  torch::Tensor weight, bias, gate;
  Shared shared;
  int64_t layer;
  DenseImpl(int64_t in, int64_t out, bool with_bias, const Shared& sh, int64_t index)
      : shared(sh), layer(index) {
    if (!sh.base.defined())
      weight = register_parameter("weight", torch::empty({out, in}));
    else if (!sh.gate_w.defined())
      gate = register_parameter("gate", torch::zeros({1}));
    if (with_bias) bias = register_parameter("bias", torch::zeros({out}));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    if (!shared.base.defined()) return F::linear(x, weight, bias);
    if (gate.defined()) return F::linear(x, torch::sigmoid(gate) * shared.base, bias);
    // x: [B, T, in]. The mean of positions 1..t at each t, then this block's gate logit.
    const int64_t T = x.size(1);
    const auto count = torch::arange(1, T + 1, x.options().dtype(torch::kFloat)).view({1, T, 1});
    const auto prefix_mean = x.cumsum(1, torch::kFloat) / count;  // fp32 sums under autocast too
    const auto g = torch::sigmoid(F::linear(prefix_mean, shared.gate_w.narrow(0, layer, 1),
                                            shared.gate_b.narrow(0, layer, 1)));  // [B, T, 1]
    auto y = g * F::linear(x, shared.base);
    return bias.defined() ? y + bias : y;
  }
};
TORCH_MODULE(Dense);

// The shared weights of model.share, one per shape.
struct SharedBases {
  Shared c_attn, attn_proj, c_fc, mlp_proj;
};

struct AttentionImpl : nn::Module {
  Dense c_attn{nullptr}, c_proj{nullptr};
  int64_t heads, width;
  double dropout;
  AttentionImpl(const config::ModelConfig& c, const SharedBases& sb, int64_t i)
      : heads(c.n_head), width(c.n_embd), dropout(c.dropout) {
    c_attn = register_module("c_attn", Dense(c.n_embd, 3 * c.n_embd, c.bias, sb.c_attn, i));
    c_proj = register_module("c_proj", Dense(c.n_embd, c.n_embd, c.bias, sb.attn_proj, i));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    const int64_t B = x.size(0), T = x.size(1), hs = width / heads;
    auto qkv = c_attn->forward(x).split(width, 2);
    auto heads_of = [&](const torch::Tensor& t) {
      return t.view({B, T, heads, hs}).transpose(1, 2);  // [B, heads, T, hs]
    };
    const auto q = heads_of(qkv[0]), k = heads_of(qkv[1]), v = heads_of(qkv[2]);
    // softmax(q k^T / sqrt(hs) + causal mask) v with dropout on the weights, as nn.functional's
    // scaled_dot_product_attention: on the CPU its flash kernel, which never materialises the
    // T x T weights (fp32, bf16 under autocast); on CUDA flash or memory-efficient attention.
    auto y = at::scaled_dot_product_attention(q, k, v, /*attn_mask=*/std::nullopt,
                                              /*dropout_p=*/is_training() ? dropout : 0.0,
                                              /*is_causal=*/true)
                 .transpose(1, 2)
                 .contiguous()
                 .view({B, T, width});
    y = c_proj->forward(y);
    if (dropout > 0) y = model::dropout(y, dropout, is_training());
    return y;
  }
};
TORCH_MODULE(Attention);

struct MlpBlockImpl : nn::Module {
  Dense c_fc{nullptr}, c_proj{nullptr};
  double dropout;
  MlpBlockImpl(const config::ModelConfig& c, const SharedBases& sb, int64_t i)
      : dropout(c.dropout) {
    c_fc = register_module("c_fc", Dense(c.n_embd, 4 * c.n_embd, c.bias, sb.c_fc, i));
    c_proj = register_module("c_proj", Dense(4 * c.n_embd, c.n_embd, c.bias, sb.mlp_proj, i));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    auto y = c_proj->forward(torch::gelu(c_fc->forward(x)));  // exact (erf) GELU, as nn.GELU()
    if (dropout > 0) y = model::dropout(y, dropout, is_training());
    return y;
  }
};
TORCH_MODULE(MlpBlock);

struct GptBlockImpl : nn::Module {
  Norm ln_1{nullptr}, ln_2{nullptr};
  Attention attn{nullptr};
  MlpBlock mlp{nullptr};
  Islands* isl = nullptr;
  std::string prefix;              // h.<i>
  std::vector<std::string> names;  // h.<i>.{ln_1,attn,ln_2,mlp}
  GptBlockImpl(const config::ModelConfig& c, int64_t index, const SharedBases& sb)
      : prefix("h." + std::to_string(index)) {
    for (const char* n : {"ln_1", "attn", "ln_2", "mlp"}) names.push_back(prefix + "." + n);
    ln_1 = register_module("ln_1", Norm(c.n_embd, c.bias));
    attn = register_module("attn", Attention(c, sb, index));
    ln_2 = register_module("ln_2", Norm(c.n_embd, c.bias));
    mlp = register_module("mlp", MlpBlock(c, sb, index));
  }
  torch::Tensor forward(torch::Tensor x) {
    auto run = [this](size_t i, const torch::Tensor& t, auto&& f) {
      return isl->call(names[i], t, f);
    };
    auto a = run(1, run(0, x, [&](const torch::Tensor& t) { return ln_1->forward(t); }),
                 [&](const torch::Tensor& t) { return attn->forward(t); });
    x = x + a;
    auto m = run(3, run(2, x, [&](const torch::Tensor& t) { return ln_2->forward(t); }),
                 [&](const torch::Tensor& t) { return mlp->forward(t); });
    return x + m;
  }
};
TORCH_MODULE(GptBlock);

struct GptImpl : nn::Module {
  nn::Embedding wte{nullptr}, wpe{nullptr};
  nn::ModuleList h{nullptr};
  Norm ln_f{nullptr};
  std::vector<GptBlock> blocks;
  SharedBases shared;
  int64_t block_size;
  double dropout, embedding_noise;
  Islands* isl = nullptr;
  int64_t checkpoint_every = 0;
  const std::string ln_f_name = "ln_f", head_name = "lm_head";
  GptImpl(const config::ModelConfig& c, int64_t vocab)
      : block_size(c.block_size), dropout(c.dropout), embedding_noise(c.embedding_noise) {
    wte = register_module("wte", nn::Embedding(vocab, c.n_embd));
    wpe = register_module("wpe", nn::Embedding(c.block_size, c.n_embd));
    if (c.share != "none") {
      auto bases = register_module("share", std::make_shared<nn::Module>());
      std::shared_ptr<nn::Module> gates;
      if (c.share == "gated_input")
        gates = bases->register_module("gate", std::make_shared<nn::Module>());
      const int64_t C = c.n_embd, L = c.n_layer;
      auto make = [&](const std::string& name, int64_t out, int64_t in) {
        Shared sh{bases->register_parameter(name, torch::empty({out, in})), {}, {}};
        if (gates) {
          auto g = gates->register_module(name, std::make_shared<nn::Module>());
          sh.gate_w = g->register_parameter("weight", torch::zeros({L, in}));
          sh.gate_b = g->register_parameter("bias", torch::zeros({L}));
        }
        return sh;
      };
      shared = {make("c_attn", 3 * C, C), make("attn_proj", C, C), make("c_fc", 4 * C, C),
                make("mlp_proj", C, 4 * C)};
    }
    h = register_module("h", nn::ModuleList());
    for (int64_t i = 0; i < c.n_layer; ++i) {
      blocks.push_back(GptBlock(c, i, shared));
      h->push_back(blocks.back());
    }
    ln_f = register_module("ln_f", Norm(c.n_embd, c.bias));
    init(c);
  }
  void init(const config::ModelConfig& c) {
    torch::NoGradGuard no_grad;
    const double proj_std = 0.02 / std::sqrt(2.0 * static_cast<double>(c.n_layer));
    for (auto& item : named_parameters()) {
      const std::string& name = item.key();
      torch::Tensor& p = item.value();
      auto ends_with = [&](const std::string& end) {
        return name.size() >= end.size() &&
               name.compare(name.size() - end.size(), end.size(), end) == 0;
      };
      const bool residual_proj =
          ends_with("c_proj.weight") || name == "share.attn_proj" || name == "share.mlp_proj";
      // A shared base is scaled by sigmoid(0) = 1/2 at init: twice the std.
      const double scale = name.rfind("share.", 0) == 0 ? 2.0 : 1.0;
      if (name.find("ln_") != std::string::npos) continue;  // LayerNorm: ones and zeros already
      if (name.rfind("share.gate.", 0) == 0) continue;      // input gates: zeros (sigmoid 1/2)
      if (p.dim() >= 2)
        p.normal_(0.0, scale * (residual_proj ? proj_std : 0.02));
      else
        p.zero_();  // biases, and the gates' logits (sigmoid 1/2)
    }
  }
  // Pipeline units: 0 the embeddings, 1..n the blocks, n+1 the final norm and the output layer
  // (which uses unit 0's wte.weight: a tied weight two stages share).
  int64_t num_units() const { return int64_t(blocks.size()) + 2; }
  torch::Tensor units(torch::Tensor x, int64_t begin, int64_t end) {
    for (int64_t u = begin; u < end; ++u) {
      if (u == 0) {
        x = embed(x);
      } else if (u == num_units() - 1) {
        x = head(x);
      } else {
        GptBlock& b = blocks[size_t(u - 1)];
        x = b->isl->call(b->prefix, x, [&](const torch::Tensor& in) { return b->forward(in); });
      }
    }
    return x;
  }
  int64_t unit_of(const std::string& name) const {
    if (name.rfind("wte.", 0) == 0 || name.rfind("wpe.", 0) == 0) return 0;
    if (name.rfind("share.", 0) == 0) return 1;  // used by every block: see units_using
    if (name.rfind("h.", 0) == 0) return 1 + std::atoll(name.c_str() + 2);
    return num_units() - 1;  // ln_f
  }
  torch::Tensor embed(const torch::Tensor& idx) {
    const int64_t T = idx.size(1);
    if (T > block_size)
      throw ConfigError("model.block_size",
                        "a window of " + std::to_string(T) +
                            " tokens is longer than the context (" + std::to_string(block_size) +
                            ")",
                        "raise model.block_size");
    const auto pos = torch::arange(T, idx.options().dtype(torch::kLong));
    auto tok = wte->forward(idx);
    // The field guide's embedding noise: N(0, sigma^2) on the token embeddings while training.
    if (embedding_noise > 0 && is_training()) tok = tok + embedding_noise * torch::randn_like(tok);
    auto x = tok + wpe->forward(pos);
    if (dropout > 0) x = model::dropout(x, dropout, is_training());
    return x;
  }
  torch::Tensor head(torch::Tensor x) {
    x = isl->call(ln_f_name, x, [&](const torch::Tensor& t) { return ln_f->forward(t); });
    // The output layer is tied to the embedding.
    return isl->call(head_name, x,
                     [&](const torch::Tensor& t) { return F::linear(t, wte->weight); });
  }
  torch::Tensor forward(const torch::Tensor& idx) {
    auto x = embed(idx);
    x = run_segments(
        blocks, checkpoint_every, x,
        [](GptBlock& b, const torch::Tensor& t) {
          return b->isl->call(b->prefix, t,
                              [&](const torch::Tensor& in) { return b->forward(in); });
        },
        [](GptBlock&) { return std::vector<torch::Tensor>{}; });
    return head(x);
  }
};
TORCH_MODULE(Gpt);

class GptModel : public Model {
 public:
  GptModel(const config::ModelConfig& c, int64_t vocab)
      : net_(c, vocab), desc_(describe_of(c, vocab)) {
    net_->isl = islands();
    for (auto& b : net_->blocks) b->isl = islands();
    if (c.share != "none") desc_.insert(desc_.size() - 1, share_note(c));
  }
  std::vector<std::string> island_names() const override {
    std::vector<std::string> out;
    for (const auto& b : net_->blocks) {
      out.push_back(b->prefix);
      out.insert(out.end(), b->names.begin(), b->names.end());
    }
    out.push_back(net_->ln_f_name);
    out.push_back(net_->head_name);
    return out;
  }
  int64_t num_blocks() const override { return static_cast<int64_t>(net_->blocks.size()); }
  void set_checkpointing(int64_t every) override { net_->checkpoint_every = every; }
  torch::Tensor forward(const torch::Tensor& x) override { return net_->forward(x); }
  int64_t num_units() const override { return net_->num_units(); }
  torch::Tensor forward_units(const torch::Tensor& x, int64_t begin, int64_t end) override {
    return net_->units(x, begin, end);
  }
  int64_t unit_of(const std::string& name) const override { return net_->unit_of(name); }
  std::vector<int64_t> units_using(const std::string& name) const override {
    if (name == "wte.weight") return {0, net_->num_units() - 1};  // embedding and output layer
    if (name.rfind("share.", 0) == 0) {                           // a shared base: every block
      std::vector<int64_t> all;
      for (int64_t u = 1; u < net_->num_units() - 1; ++u) all.push_back(u);
      return all;
    }
    return {unit_of(name)};
  }
  NamedTensors named_parameters() override {
    NamedTensors out;
    for (auto& p : net_->named_parameters()) out.emplace_back(p.key(), p.value());
    return out;
  }
  NamedTensors named_buffers() override { return {}; }
  void set_training(bool on) override { net_->train(on); }
  void to(const torch::Device& device) override { net_->to(device); }
  std::string describe() const override { return desc_; }

 private:
  static std::string describe_of(const config::ModelConfig& c, int64_t vocab) {
    return "gpt(n_layer " + std::to_string(c.n_layer) + ", n_head " + std::to_string(c.n_head) +
           ", n_embd " + std::to_string(c.n_embd) + ", block " + std::to_string(c.block_size) +
           ", vocab " + std::to_string(vocab) + ")";
  }
  // What sharing saved: the unshared model has n_layer copies of each base and no gates (gated:
  // one per block and base; gated_input: each base's gate layer).
  std::string share_note(const config::ModelConfig& c) {
    int64_t bases = 0, gates = c.share == "gated" ? 4 * c.n_layer : 0;
    for (const Shared* s : {&net_->shared.c_attn, &net_->shared.attn_proj, &net_->shared.c_fc,
                            &net_->shared.mlp_proj}) {
      bases += s->base.numel();
      if (s->gate_w.defined()) gates += s->gate_w.numel() + s->gate_b.numel();
    }
    int64_t total = 0;
    for (auto& p : net_->parameters()) total += p.numel();
    const int64_t unshared = total - gates + (c.n_layer - 1) * bases;
    return fmt::format("; share {}: {:.1f} % fewer parameters than the {} unshared", c.share,
                       100.0 * double(unshared - total) / double(unshared), unshared);
  }
  Gpt net_;
  std::string desc_;
};

}  // namespace

std::unique_ptr<Model> make_gpt(const config::ModelConfig& c, int64_t vocab) {
  return std::make_unique<GptModel>(c, vocab);
}

}  // namespace mltrain::model
