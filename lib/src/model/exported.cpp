// The interpreter of an exported program. At load every node is resolved once to its operator
// handle, its arguments laid out in the operator schema's order (keyword arguments placed by name,
// defaults filled in) and every value given a slot; a step is then a loop of callBoxed over those
// plans. A value's slot is cleared after its last use, so intermediates live no longer than in
// eager PyTorch.
//
// Evaluation is the same graph with the training flags turned off: the `training` argument of the
// batch-norm operators and `train` of the dropout family false, scaled-dot-product attention's
// dropout_p 0, and BatchNorm's `num_batches_tracked.add_(1)` skipped. That is what model.eval()
// changes in these modules (torch/nn/modules/batchnorm.py, dropout.py; transformers passes
// dropout=0.0 to attention when not training); tests check eval outputs against model.eval().
#include "exported.hpp"
#include "layout.hpp"

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/record_function.h>

#include <cmath>
#include <filesystem>
#include <map>
#include <optional>
#include <set>

#include "mltrain/core/error.hpp"
#include "mltrain/formats/pt2.hpp"
#include "mltrain/model/script_kernels.hpp"

namespace mltrain::model {
namespace {
using formats::Argument;
using formats::Pt2Program;

c10::ScalarType scalar_type(int t, const std::string& path) {
  switch (t) {
    case 1:
      return c10::kByte;
    case 2:
      return c10::kChar;
    case 3:
      return c10::kShort;
    case 4:
      return c10::kInt;
    case 5:
      return c10::kLong;
    case 6:
      return c10::kHalf;
    case 7:
      return c10::kFloat;
    case 8:
      return c10::kDouble;
    case 9:
      return c10::kComplexHalf;
    case 10:
      return c10::kComplexFloat;
    case 11:
      return c10::kComplexDouble;
    case 12:
      return c10::kBool;
    case 13:
      return c10::kBFloat16;
    case 28:
      return c10::kUInt16;
    case 29:
      return c10::kFloat8_e4m3fn;
    case 30:
      return c10::kFloat8_e5m2;
    case 31:
      return c10::kFloat8_e4m3fnuz;
    case 32:
      return c10::kFloat8_e5m2fnuz;
    case 34:
      return c10::kUInt32;
    case 35:
      return c10::kUInt64;
    default:
      throw DataError(path, "a tensor of scalar type " + std::to_string(t) +
                                " (torch/_export/serde/schema.py) mltrain cannot make");
  }
}

c10::Layout layout(int64_t l) {
  return l == 7 ? c10::kStrided : l == 6 ? c10::kMkldnn : c10::kSparse;
}

c10::MemoryFormat memory_format(int64_t m) {
  switch (m) {
    case 2:
      return c10::MemoryFormat::ChannelsLast;
    case 3:
      return c10::MemoryFormat::ChannelsLast3d;
    case 4:
      return c10::MemoryFormat::Preserve;
    default:
      return c10::MemoryFormat::Contiguous;
  }
}

std::string shape_text(const std::vector<formats::SymInt>& sizes) {
  std::string s = "[";
  for (size_t i = 0; i < sizes.size(); ++i)
    s += (i ? ", " : "") + (sizes[i].is_symbol ? sizes[i].symbol : std::to_string(sizes[i].value));
  return s + "]";
}

std::string shape_text(c10::IntArrayRef sizes) {
  std::string s = "[";
  for (size_t i = 0; i < sizes.size(); ++i) s += (i ? ", " : "") + std::to_string(sizes[i]);
  return s + "]";
}

// "torch.ops.aten.conv2d.default" -> ("aten::conv2d", ""); "torch.ops.aten.add.Tensor" ->
// ("aten::add", "Tensor"); "torch.ops.mylib.op.default" -> ("mylib::op", "").
std::optional<std::pair<std::string, std::string>> op_name(const std::string& target) {
  const std::string head = "torch.ops.";
  if (target.rfind(head, 0) != 0) return std::nullopt;
  const std::string rest = target.substr(head.size());
  const size_t a = rest.find('.');
  if (a == std::string::npos) return std::nullopt;
  const size_t b = rest.find('.', a + 1);
  const std::string ns = rest.substr(0, a);
  const std::string name =
      rest.substr(a + 1, b == std::string::npos ? std::string::npos : b - a - 1);
  std::string overload = b == std::string::npos ? "" : rest.substr(b + 1);
  if (overload == "default") overload = "";
  return std::make_pair(ns + "::" + name, overload);
}

// Python's operator module on SymInts (the graph's shape arithmetic, e.g. "_operator.mul").
enum class SymOp {
  kNone,
  kAdd,
  kSub,
  kMul,
  kFloorDiv,
  kMod,
  kNeg,
  kTrueDiv,
  kEq,
  kNe,
  kLt,
  kLe,
  kGt,
  kGe,
  kMax,
  kMin
};
SymOp sym_op(const std::string& target) {
  static const std::map<std::string, SymOp> ops = {
      {"_operator.add", SymOp::kAdd},         {"_operator.sub", SymOp::kSub},
      {"_operator.mul", SymOp::kMul},         {"_operator.floordiv", SymOp::kFloorDiv},
      {"_operator.mod", SymOp::kMod},         {"_operator.neg", SymOp::kNeg},
      {"_operator.truediv", SymOp::kTrueDiv}, {"_operator.eq", SymOp::kEq},
      {"_operator.ne", SymOp::kNe},           {"_operator.lt", SymOp::kLt},
      {"_operator.le", SymOp::kLe},           {"_operator.gt", SymOp::kGt},
      {"_operator.ge", SymOp::kGe},           {"torch.sym_max", SymOp::kMax},
      {"torch.sym_min", SymOp::kMin}};
  auto it = ops.find(target);
  return it == ops.end() ? SymOp::kNone : it->second;
}

// Python's floor division and modulo on integers (rounding toward minus infinity).
int64_t floordiv(int64_t a, int64_t b) { return a / b - ((a % b != 0) && ((a < 0) != (b < 0))); }

// A Python number where the schema takes a Tensor (x.add_(1) as aten::add_.Tensor): a 0-dim
// tensor marked as a wrapped number, as PyTorch's argument parser makes it, so type promotion
// treats it as a scalar (an int64 buffer plus 1 stays int64; a float tensor times 2 stays float).
c10::IValue wrapped_number(const c10::IValue& v) {
  at::Tensor t = v.isInt()      ? at::scalar_tensor(v.toInt(), at::kLong)
                 : v.isDouble() ? at::scalar_tensor(v.toDouble(), at::kDouble)
                                : at::scalar_tensor(v.toBool(), at::kBool);
  t.unsafeGetTensorImpl()->set_wrapped_number(true);
  return t;
}

// One argument of a planned call: a constant, a slot, or a list assembled from slots.
struct ArgPlan {
  // kNumber: a SymInt/SymFloat slot where the schema takes a Tensor (x * (t - 1)), wrapped.
  enum Kind {
    kConst,
    kSlot,
    kNumber,
    kTensorList,
    kOptTensorList,
    kIntList,
    kDevice
  } kind = kConst;
  c10::IValue value;          // kConst
  int slot = -1;              // kSlot
  std::vector<int> slots;     // lists: -1 for None (optional tensors) or for a constant int
  std::vector<int64_t> ints;  // kIntList: the constants where slots[i] == -1
  std::string device;         // kDevice: the export's device ("cpu"), remapped by to()
};

struct Step {
  enum Kind { kOp, kSym } kind = kOp;
  std::optional<c10::OperatorHandle> op;
  SymOp sym = SymOp::kNone;
  std::vector<ArgPlan> args;
  std::vector<int> outs;    // slots of the results (-1: dropped)
  bool out_list = false;    // one Tensor[] result spread over `outs`
  int train_arg = -1;       // index in args of `training`/`train` (eval: false)
  int dropout_p_arg = -1;   // scaled_dot_product_attention's dropout_p (eval: 0)
  bool train_only = false;  // num_batches_tracked.add_(1): skipped in evaluation
  std::vector<int> free_after;
  std::string label;  // "'conv2d_3' (layer3.1.conv2) torch.ops.aten.conv2d.default", for errors
  std::string scope;  // "node layer3.1.conv2: aten::conv2d", the profiler's row
};

class ExportedModel : public Model {
 public:
  ExportedModel(const config::ModelConfig& c, const std::vector<int64_t>& sample_shape)
      : path_(c.path), output_key_(c.output) {
    Pt2Program p = formats::read_pt2(path_);
    if (c.script_kernels == "mltrain")
      kernels_ = use_mltrain_kernels(p.graph, c.fused_batchnorm, c.conv1x1_as_linear).text();
    try {
      load_tensors(p);
      plan(p);
    } catch (const c10::Error& e) {  // LibTorch refusing what a damaged table asks of it
      throw DataError(path_, std::string("cannot load the program: ") + e.what_without_backtrace(),
                      "the archive is damaged or not from torch.export.save; save it again");
    }
    choose_output(p);
    check_sample_shape(sample_shape);
    if (c.channels_last) try_channels_last();
  }

  torch::Tensor forward(const torch::Tensor& x) override {
    check_input(x);
    std::vector<c10::IValue> v(num_slots_);
    for (const auto& [slot, t] : fixed_) v[slot] = t;
    v[input_slot_] = cl_ ? channels_last(x) : x;
    for (const Step& s : steps_) {
      if (s.train_only && !training_) continue;
      run(s, v);
      for (int f : s.free_after) v[f] = c10::IValue();
    }
    for (const auto& [slot, buffer] : mutations_) {  // a functional graph's new buffer values
      torch::NoGradGuard no_grad;
      buffer.copy_(v[slot].toTensor());
    }
    const c10::IValue& out = v[output_slot_];
    if (!out.isTensor())
      throw RuntimeError(path_, "the chosen output '" + output_name_ + "' is not a tensor");
    return out.toTensor();
  }

  NamedTensors named_parameters() override { return params_; }
  NamedTensors named_buffers() override { return buffers_; }
  std::vector<std::pair<std::string, std::string>> tied_names() const override { return aliases_; }
  void set_training(bool on) override {
    if (on && exported_in_eval_)
      throw ConfigError("model.path",
                        path_ + " was exported in evaluation mode (" + eval_evidence_ +
                            "): training it would run BatchNorm on running statistics and no "
                            "dropout",
                        "call model.train() before torch.export.export, then save it again");
    training_ = on;
  }
  void to(const torch::Device& device) override {
    torch::NoGradGuard no_grad;
    for (auto* list : {&params_, &buffers_, &hidden_})
      for (auto& [name, t] : *list) t.set_data(t.data().to(device));
    for (Step& s : steps_)
      for (ArgPlan& a : s.args)
        if (a.kind == ArgPlan::kDevice && a.device == export_device_) a.value = c10::Device(device);
  }
  std::string describe() const override {
    return "exported(" + path_ + "; " + std::to_string(steps_.size()) + " nodes" +
           (cl_ ? "; channels_last" : "") + layout_note_ +
           (kernels_.empty() ? "" : "; mltrain kernels: " + kernels_) + ")";
  }

 private:
  void run(const Step& s, std::vector<c10::IValue>& v) {
    if (s.kind == Step::kSym) return run_sym(s, v);
    torch::jit::Stack stack;
    stack.reserve(s.args.size());
    for (size_t i = 0; i < s.args.size(); ++i) {
      const ArgPlan& a = s.args[i];
      if (!training_ && int(i) == s.train_arg) {
        stack.emplace_back(false);
        continue;
      }
      if (!training_ && int(i) == s.dropout_p_arg) {
        stack.emplace_back(0.0);
        continue;
      }
      switch (a.kind) {
        case ArgPlan::kConst:
        case ArgPlan::kDevice:
          stack.push_back(a.value);
          break;
        case ArgPlan::kSlot:
          stack.push_back(v[a.slot]);
          break;
        case ArgPlan::kNumber:
          stack.push_back(wrapped_number(v[a.slot]));
          break;
        case ArgPlan::kTensorList: {
          c10::List<at::Tensor> l;
          l.reserve(a.slots.size());
          for (int k : a.slots) l.push_back(v[k].toTensor());
          stack.emplace_back(std::move(l));
          break;
        }
        case ArgPlan::kOptTensorList: {
          c10::List<std::optional<at::Tensor>> l;
          l.reserve(a.slots.size());
          for (int k : a.slots)
            l.push_back(k < 0 ? std::optional<at::Tensor>()
                              : std::optional<at::Tensor>(v[k].toTensor()));
          stack.emplace_back(std::move(l));
          break;
        }
        case ArgPlan::kIntList: {
          std::vector<int64_t> l(a.slots.size());
          for (size_t k = 0; k < l.size(); ++k)
            l[k] = a.slots[k] < 0 ? a.ints[k] : v[a.slots[k]].toInt();
          stack.emplace_back(std::move(l));
          break;
        }
      }
    }
    try {
      // A user scope per node (a flag test when no profiler listens): `mltrain profile` lists
      // the forward by the module that ran it.
      RECORD_USER_SCOPE(s.scope.c_str());
      s.op->callBoxed(stack);
    } catch (const c10::Error& e) {
      throw RuntimeError(path_, "node " + s.label + " failed: " + e.what_without_backtrace(),
                         "check that the input fits what the model was exported with");
    }
    if (s.out_list) {
      const auto list = stack.at(0).toTensorList();
      for (size_t k = 0; k < s.outs.size() && k < list.size(); ++k)
        if (s.outs[k] >= 0) v[s.outs[k]] = list.get(k);
      return;
    }
    for (size_t k = 0; k < s.outs.size() && k < stack.size(); ++k)
      if (s.outs[k] >= 0) v[s.outs[k]] = std::move(stack[k]);
  }

  void run_sym(const Step& s, std::vector<c10::IValue>& v) {
    auto val = [&](const ArgPlan& a) -> c10::IValue {
      return a.kind == ArgPlan::kSlot ? v[a.slot] : a.value;
    };
    const c10::IValue x = val(s.args.at(0));
    if (s.sym == SymOp::kNeg) {
      v[s.outs[0]] = x.isInt() ? c10::IValue(-x.toInt()) : c10::IValue(-x.toDouble());
      return;
    }
    const c10::IValue y = val(s.args.at(1));
    // Python's semantics: int op int stays int (floor division and modulo round toward minus
    // infinity), true division and any float operand give a float.
    auto apply = [&](auto a, auto b) -> c10::IValue {
      switch (s.sym) {
        case SymOp::kAdd:
          return a + b;
        case SymOp::kSub:
          return a - b;
        case SymOp::kMul:
          return a * b;
        case SymOp::kMax:
          return std::max(a, b);
        case SymOp::kMin:
          return std::min(a, b);
        case SymOp::kEq:
          return a == b;
        case SymOp::kNe:
          return a != b;
        case SymOp::kLt:
          return a < b;
        case SymOp::kLe:
          return a <= b;
        case SymOp::kGt:
          return a > b;
        case SymOp::kGe:
          return a >= b;
        default:
          throw RuntimeError(path_, "node " + s.label + ": unsupported shape arithmetic");
      }
    };
    if (x.isInt() && y.isInt() && s.sym != SymOp::kTrueDiv) {
      const int64_t a = x.toInt(), b = y.toInt();
      if (s.sym == SymOp::kFloorDiv || s.sym == SymOp::kMod) {
        if (b == 0)
          throw RuntimeError(
              path_,
              "node " + s.label + ": integer division by zero in the graph's shape arithmetic");
        v[s.outs[0]] = s.sym == SymOp::kFloorDiv ? floordiv(a, b) : a - floordiv(a, b) * b;
      } else {
        v[s.outs[0]] = apply(a, b);
      }
      return;
    }
    const double a = x.isInt() ? double(x.toInt()) : x.toDouble();
    const double b = y.isInt() ? double(y.toInt()) : y.toDouble();
    v[s.outs[0]] = s.sym == SymOp::kTrueDiv    ? c10::IValue(a / b)
                   : s.sym == SymOp::kFloorDiv ? c10::IValue(std::floor(a / b))
                                               : apply(a, b);
  }

  // model.channels_last: 4-D weights and inputs NHWC, so oneDNN's convolutions (depthwise ones
  // most: MobileNetV3-small 0.30x -> see PERFORMANCE.md) run in their fast layout; every
  // operator keeps its values (the layout changes the kernels' summation order only). A graph
  // whose view ops need the exported layout cannot: one forward in evaluation mode at the
  // export's example shape finds out at load, and the model stays in the exported layout.
  void try_channels_last() {
    if (input_meta_.sizes.size() != 4) return;
    bool any = false;
    for (const auto& [n, t] : params_) any = any || t.dim() == 4;
    if (!any) return;
    torch::NoGradGuard no_grad;
    auto set = [&](bool on) {
      for (auto& [n, t] : params_)
        if (t.dim() == 4)
          t.set_data(on ? channels_last(t.data()) : t.data().clone(at::MemoryFormat::Contiguous));
      cl_ = on;
    };
    set(true);
    std::vector<int64_t> shape;
    for (const auto& d : input_meta_.sizes) shape.push_back(std::max<int64_t>(d.value, 1));
    const bool was = training_;
    training_ = false;
    try {
      forward(
          torch::zeros(shape, torch::TensorOptions().dtype(scalar_type(input_meta_.dtype, path_))));
    } catch (const Error& e) {
      set(false);
      layout_note_ = "; channels_last off: " + e.message().substr(0, e.message().find(" failed"));
    }
    training_ = was;
  }

  int slot(const std::string& name) {
    auto it = slots_.find(name);
    if (it != slots_.end()) return it->second;
    slots_[name] = num_slots_;
    return num_slots_++;
  }
  int known(const std::string& name, const std::string& where) {
    auto it = slots_.find(name);
    if (it == slots_.end())
      throw DataError(path_, where + " uses '" + name + "', which no earlier node or input defines",
                      "export the model again: the graph is damaged");
    return it->second;
  }

  torch::Tensor tensor_of(const Pt2Program& p, const formats::Payload& pl, const std::string& name,
                          bool constant) {
    if (pl.use_pickle)
      throw DataError(path_,
                      "'" + name + "' is a pickled tensor subclass, which mltrain cannot read",
                      "export a model whose weights are plain tensors");
    const auto dtype = scalar_type(pl.meta.dtype, path_);
    std::vector<int64_t> sizes, strides;
    for (const auto& s : pl.meta.sizes) sizes.push_back(s.value);
    for (const auto& s : pl.meta.strides) strides.push_back(s.value);
    const int64_t offset = pl.meta.storage_offset.value;
    const uint64_t nbytes = p.payload_size(pl.path_name, constant);
    const int64_t esize = c10::elementSize(dtype);
    // As PyTorch's loader: the storage holds whole elements (the pt2 fuzzer found the copy into a
    // storage rounded down overrunning it).
    if (nbytes % uint64_t(esize) != 0)
      throw DataError(path_,
                      "weight file " + pl.path_name + " of '" + name + "' has " +
                          std::to_string(nbytes) + " bytes, not a whole number of " +
                          formats::pt2_dtype_name(pl.meta.dtype) + " elements",
                      "the archive is damaged; save it again");
    // The farthest element the view reaches must lie inside the stored bytes.
    int64_t last = offset;
    bool empty = false;
    for (size_t d = 0; d < sizes.size(); ++d) {
      if (sizes[d] < 0 || (d < strides.size() && strides[d] < 0))
        throw DataError(path_, "'" + name + "' has a negative size or stride");
      if (sizes[d] == 0) empty = true;
      if (d < strides.size() && sizes[d] > 0) last += (sizes[d] - 1) * strides[d];
    }
    if (strides.size() != sizes.size() || offset < 0 ||
        (!empty && uint64_t(last + 1) * uint64_t(esize) > nbytes))
      throw DataError(path_,
                      "'" + name + "' (" + shape_text(pl.meta.sizes) + ", " +
                          formats::pt2_dtype_name(pl.meta.dtype) + ") needs more than the " +
                          std::to_string(nbytes) + " bytes of " + pl.path_name,
                      "the archive is damaged; save it again");
    auto storage = torch::empty({int64_t(nbytes / esize)}, torch::TensorOptions().dtype(dtype));
    if (nbytes) p.read_payload(pl.path_name, constant, storage.data_ptr());
    if (empty) return torch::empty(sizes, dtype);
    return storage.as_strided(sizes, strides, offset).clone(at::MemoryFormat::Preserve);
  }

  void load_tensors(const Pt2Program& p) {
    // Stored view -> (first name, tensor): a second name of the same view is a tie.
    std::map<std::string, std::pair<std::string, torch::Tensor>> views;
    for (const auto& in : p.inputs) {
      if (in.kind == formats::InputSpec::kUserInput) {
        if (in.constant.kind != Argument::kTensor) continue;
        user_inputs_.push_back(in.arg);
        continue;
      }
      if (in.kind == formats::InputSpec::kCustomObj || in.kind == formats::InputSpec::kToken)
        throw DataError(path_,
                        "the graph takes a " +
                            std::string(in.kind == formats::InputSpec::kToken
                                            ? "side-effect token"
                                            : "custom object '" + in.target + "'") +
                            ", which mltrain cannot train",
                        "export a model without custom classes or effectful ops");
      if (in.kind == formats::InputSpec::kConstant) {
        const int s = slot(in.arg);
        const Argument& a = in.constant;
        fixed_.emplace_back(s, a.kind == Argument::kInt      ? c10::IValue(a.i)
                               : a.kind == Argument::kFloat  ? c10::IValue(a.f)
                               : a.kind == Argument::kBool   ? c10::IValue(a.b)
                               : a.kind == Argument::kString ? c10::IValue(a.s)
                                                             : c10::IValue());
        continue;
      }
      // Non-persistent buffers (rotary inv_freq) are saved with the lifted constants.
      const bool constant =
          in.kind == formats::InputSpec::kTensorConstant ||
          (in.kind == formats::InputSpec::kBuffer && !in.persistent && !p.weights.count(in.target));
      const auto& table = constant ? p.constants : p.weights;
      auto it = table.find(in.target);
      if (it == table.end())
        throw DataError(path_,
                        std::string(constant                                    ? "constant"
                                    : in.kind == formats::InputSpec::kParameter ? "parameter"
                                                                                : "buffer") +
                            " '" + in.target + "' is missing from the archive's weights",
                        "save the program again with torch.export.save");
      // Tied weights (GPT-2's lm_head.weight is transformer.wte.weight): torch.export keeps a
      // placeholder for each name, the nodes use one of them, and the archive stores one storage
      // with the same view for both. They stay one tensor here, named once, by its first name,
      // as PyTorch's named_parameters() does; the other name is an alias (state_dict keeps both).
      const formats::Payload& pl = it->second;
      const std::string view = pl.path_name + "|" + std::to_string(constant) + "|" +
                               shape_text(pl.meta.sizes) + shape_text(pl.meta.strides) +
                               std::to_string(pl.meta.storage_offset.value) + "|" +
                               std::to_string(pl.meta.dtype);
      if (auto tied = views.find(view); tied != views.end()) {
        aliases_.emplace_back(in.target, tied->second.first);
        fixed_.emplace_back(slot(in.arg), tied->second.second);
        if (in.kind == formats::InputSpec::kBuffer) buffer_args_[in.arg] = in.target;
        continue;
      }
      torch::Tensor t = tensor_of(p, pl, in.target, constant);
      views[view] = {in.target, t};
      if (in.kind == formats::InputSpec::kParameter) {
        if (!t.is_floating_point() && !t.is_complex())
          throw DataError(path_,
                          "parameter '" + in.target + "' is " +
                              formats::pt2_dtype_name(it->second.meta.dtype) +
                              "; only floating-point parameters can be trained",
                          "register integer tensors as buffers, not nn.Parameter");
        t.requires_grad_(true);
        params_.emplace_back(in.target, t);
      } else if (in.kind == formats::InputSpec::kBuffer && in.persistent) {
        buffers_.emplace_back(in.target, t);
      } else {
        hidden_.emplace_back(in.target, t);  // non-persistent buffers and lifted constants
      }
      // The slot holds the model's own tensor: to() and the optimizer change it in place
      // (set_data keeps the tensor), so every step sees the current values.
      fixed_.emplace_back(slot(in.arg), t);
      if (in.kind == formats::InputSpec::kBuffer) buffer_args_[in.arg] = in.target;
    }
    if (user_inputs_.size() != 1) {
      std::string names;
      for (const auto& n : user_inputs_) names += (names.empty() ? "" : ", ") + n;
      throw ConfigError("model.path",
                        path_ + ": the exported forward takes " +
                            std::to_string(user_inputs_.size()) + " tensor inputs (" + names +
                            "); mltrain feeds it one batch",
                        "export a wrapper whose forward(x) takes the batch alone (other inputs "
                        "as defaults or buffers)");
    }
    input_slot_ = slot(user_inputs_[0]);
    const auto meta = p.graph.tensor_values.find(user_inputs_[0]);
    if (meta == p.graph.tensor_values.end())
      throw DataError(path_, "the graph has no shape for its input '" + user_inputs_[0] + "'");
    input_meta_ = meta->second;
    ranges_ = p.ranges;
  }

  ArgPlan plan_arg(const Argument& a, const c10::Argument& schema, const std::string& where) {
    ArgPlan p;
    const auto kind = schema.type()->kind();
    switch (a.kind) {
      case Argument::kNone:
        p.value = c10::IValue();
        break;
      case Argument::kTensor:
        p.kind = ArgPlan::kSlot, p.slot = known(a.names[0], where);
        break;
      case Argument::kTensors:
        p.kind = ArgPlan::kTensorList;
        for (const auto& n : a.names) p.slots.push_back(known(n, where));
        break;
      case Argument::kOptionalTensors:
        p.kind = ArgPlan::kOptTensorList;
        for (const auto& n : a.names) p.slots.push_back(n.empty() ? -1 : known(n, where));
        break;
      case Argument::kInt:
        p.value = kind == c10::TypeKind::FloatType ? c10::IValue(double(a.i)) : c10::IValue(a.i);
        break;
      case Argument::kInts:
        p.value = c10::IValue(a.ints);
        break;
      case Argument::kFloat:
        p.value = a.f;
        break;
      case Argument::kFloats:
        p.value = c10::IValue(a.floats);
        break;
      case Argument::kBool:
        p.value = a.b;
        break;
      case Argument::kBools: {
        c10::List<bool> l;
        for (bool b : a.bools) l.push_back(b);
        p.value = l;
        break;
      }
      case Argument::kString:
        p.value = a.s;
        break;
      case Argument::kStrings:
        p.value = c10::IValue(a.strings);
        break;
      case Argument::kSymInt:
      case Argument::kSymFloat:
      case Argument::kSymBool:
        if (!a.names.empty()) {
          p.kind = kind == c10::TypeKind::TensorType ? ArgPlan::kNumber : ArgPlan::kSlot;
          p.slot = known(a.names[0], where);
        } else {
          p.value = a.kind == Argument::kSymInt     ? c10::IValue(a.i)
                    : a.kind == Argument::kSymFloat ? c10::IValue(a.f)
                                                    : c10::IValue(a.b);
        }
        break;
      case Argument::kSymInts:
        p.kind = ArgPlan::kIntList;
        p.ints = a.ints;
        for (const auto& n : a.names) p.slots.push_back(n.empty() ? -1 : known(n, where));
        break;
      case Argument::kScalarType:
        p.value = c10::IValue(int64_t(scalar_type(int(a.i), path_)));
        break;
      case Argument::kMemoryFormat:
        p.value = c10::IValue(int64_t(memory_format(a.i)));
        break;
      case Argument::kLayout:
        p.value = c10::IValue(int64_t(layout(a.i)));
        break;
      case Argument::kDevice:
        p.kind = ArgPlan::kDevice;
        p.device = a.s;
        p.value = c10::Device(a.s);
        break;
      case Argument::kOther:
        throw DataError(path_,
                        where + ": argument '" + schema.name() + "' is a " + a.s +
                            ", which mltrain does not run",
                        "export a model without higher-order ops or custom objects");
    }
    // A Python number where the schema takes a Tensor (x.add_(1) as aten::add_.Tensor).
    const bool number = p.value.isInt() || p.value.isDouble() || p.value.isBool();
    if (kind == c10::TypeKind::TensorType && p.kind == ArgPlan::kConst && number)
      p.value = wrapped_number(p.value);
    return p;
  }

  void plan(const Pt2Program& p) {
    export_device_ = input_meta_.device;
    std::map<int, size_t> last_use;  // value -> index of the last step reading it
    bool saw_train_true = false;
    for (size_t i = 0; i < p.graph.nodes.size(); ++i) {
      const formats::Node& n = p.graph.nodes[i];
      Step s;
      s.label = "'" + (n.name.empty() ? "#" + std::to_string(i) : n.name) + "'" +
                (n.module_stack.empty() ? "" : " (" + n.module_stack + ")") + " " + n.target;
      s.sym = sym_op(n.target);
      if (s.sym != SymOp::kNone) {
        s.kind = Step::kSym;
        for (const auto& in : n.inputs) {
          ArgPlan a;
          if (!in.arg.names.empty())
            a.kind = ArgPlan::kSlot, a.slot = known(in.arg.names[0], "node " + s.label);
          else
            a.value = in.arg.kind == Argument::kFloat || in.arg.kind == Argument::kSymFloat
                          ? c10::IValue(in.arg.f)
                          : c10::IValue(in.arg.i);
          s.args.push_back(a);
        }
        if (s.args.empty() || (s.sym != SymOp::kNeg && s.args.size() < 2))
          throw DataError(path_, "node " + s.label + " has too few operands");
      } else {
        const auto name = op_name(n.target);
        if (!name)
          throw DataError(path_,
                          "node " + s.label + ": '" + n.target +
                              "' is not an operator mltrain can run (higher-order ops such as "
                              "torch.cond and Python calls are not supported)",
                          "export the model without control flow ops, or rewrite that part");
        auto handle = c10::Dispatcher::singleton().findSchema({name->first, name->second});
        if (!handle)
          throw DataError(path_,
                          "node " + s.label + ": operator " + name->first +
                              (name->second.empty() ? "" : "." + name->second) +
                              " is not registered with LibTorch's dispatcher (a custom op whose "
                              "library is not loaded?)",
                          "mltrain runs ATen operators and those its own kernels register; "
                          "export the model with standard PyTorch ops");
        s.op = *handle;
        const auto& schema = handle->schema();
        s.scope = kNodeScope + (n.module_stack.empty() ? n.name : n.module_stack) + ": " +
                  schema.name() + (name->second.empty() ? "" : "." + name->second);
        const auto& args = schema.arguments();
        std::vector<bool> used(n.inputs.size(), false);
        for (size_t k = 0; k < args.size(); ++k) {
          const formats::NamedArgument* given = nullptr;
          for (size_t j = 0; j < n.inputs.size(); ++j)
            if (!used[j] && n.inputs[j].name == args[k].name()) {
              given = &n.inputs[j];
              used[j] = true;
              break;
            }
          // Older archives name positional arguments by position only.
          if (!given && k < n.inputs.size() && !used[k] && n.inputs[k].name.empty()) {
            given = &n.inputs[k];
            used[k] = true;
          }
          ArgPlan a;
          if (given) {
            a = plan_arg(given->arg, args[k], "node " + s.label);
          } else if (args[k].default_value()) {
            a.value = *args[k].default_value();
          } else {
            throw DataError(path_, "node " + s.label + " lacks argument '" + args[k].name() +
                                       "' of " + schema.name());
          }
          const std::string& an = args[k].name();
          const bool flag_arg =
              args[k].type()->kind() == c10::TypeKind::BoolType &&
              ((an == "training" && schema.name().find("batch_norm") != std::string::npos) ||
               (an == "train" && schema.name().find("dropout") != std::string::npos));
          if (flag_arg) {
            s.train_arg = int(k);
            if (a.kind == ArgPlan::kConst && a.value.isBool()) {
              const bool on = a.value.toBool();
              if (on)
                saw_train_true = true;
              else if (eval_evidence_.empty())
                eval_evidence_ = "node " + s.label + " has " + an + "=False";
            }
          }
          if (an == "dropout_p" && schema.name() == "aten::scaled_dot_product_attention")
            s.dropout_p_arg = int(k);
          s.args.push_back(std::move(a));
        }
        for (size_t j = 0; j < n.inputs.size(); ++j)
          if (!used[j])
            throw DataError(path_,
                            "node " + s.label + " passes '" + n.inputs[j].name + "', which " +
                                schema.name() + " does not take in this LibTorch",
                            "export with the PyTorch version mltrain links (2.15)");
        // BatchNorm's num_batches_tracked.add_(1) happens in training only.
        if (schema.name() == "aten::add_" && !s.args.empty() && s.args[0].kind == ArgPlan::kSlot)
          for (const auto& [arg, target] : buffer_args_)
            if (slots_.count(arg) && slots_[arg] == s.args[0].slot && target.size() >= 19 &&
                target.compare(target.size() - 19, 19, "num_batches_tracked") == 0)
              s.train_only = true;
        const auto& returns = schema.returns();
        s.out_list = returns.size() == 1 && returns[0].type()->kind() == c10::TypeKind::ListType &&
                     n.outputs.size() == 1 && n.outputs[0].kind == Argument::kTensors;
      }
      // Results.
      auto define = [&](const std::string& name) { return name.empty() ? -1 : slot(name); };
      if (s.out_list) {
        for (const auto& nm : n.outputs[0].names) s.outs.push_back(define(nm));
      } else {
        for (const auto& o : n.outputs) {
          if (o.kind == Argument::kTensor || o.kind == Argument::kSymInt ||
              o.kind == Argument::kSymFloat || o.kind == Argument::kSymBool)
            s.outs.push_back(o.names.empty() ? -1 : define(o.names[0]));
          else if (o.kind == Argument::kTensors && o.names.size() == 1)
            s.outs.push_back(define(o.names[0]));
          else
            s.outs.push_back(-1);
        }
      }
      for (const auto& a : s.args)
        for (int k : a.kind == ArgPlan::kSlot || a.kind == ArgPlan::kNumber
                         ? std::vector<int>{a.slot}
                         : a.slots)
          if (k >= 0) last_use[k] = i;
      steps_.push_back(std::move(s));
    }
    if (!saw_train_true && !eval_evidence_.empty()) exported_in_eval_ = true;
    // Graph outputs, and what they are.
    size_t user = 0;
    for (size_t k = 0; k < p.graph.outputs.size() && k < p.outputs.size(); ++k) {
      const Argument& o = p.graph.outputs[k];
      if (o.names.empty()) continue;
      const int s = known(o.names[0], "the graph's outputs");
      last_use[s] = steps_.size();
      if (p.outputs[k].kind == formats::OutputSpec::kUserOutput) {
        const std::string leaf =
            user < p.output_leaves.size() ? p.output_leaves[user] : std::to_string(user);
        user_outputs_.emplace_back(leaf.empty() ? "output" : leaf, s);
        ++user;
      } else if (p.outputs[k].kind == formats::OutputSpec::kBufferMutation) {
        for (auto& [name, t] : buffers_)
          if (name == p.outputs[k].target) mutations_.emplace_back(s, t);
        for (auto& [name, t] : hidden_)
          if (name == p.outputs[k].target) mutations_.emplace_back(s, t);
      } else if (p.outputs[k].kind != formats::OutputSpec::kUserInputMutation) {
        throw DataError(path_,
                        "the graph has a loss or gradient output: a joint forward-backward "
                        "graph, which mltrain does not train",
                        "export the forward program with torch.export.export");
      }
    }
    // Free each value after its last reader; never the fixed slots (weights) or the input.
    std::set<int> fixed;
    for (const auto& [s, v] : fixed_) fixed.insert(s);
    for (const auto& [s, idx] : last_use) {
      if (fixed.count(s) || idx >= steps_.size()) continue;
      steps_[idx].free_after.push_back(s);
    }
    // A step's results nobody reads are freed right after it.
    for (size_t i = 0; i < steps_.size(); ++i)
      for (int o : steps_[i].outs)
        if (o >= 0 && !last_use.count(o)) steps_[i].free_after.push_back(o);
  }

  void choose_output(const Pt2Program& p) {
    std::string names;
    for (const auto& [n, s] : user_outputs_) names += (names.empty() ? "" : ", ") + n;
    if (user_outputs_.empty())
      throw DataError(path_, "the exported program returns no tensor",
                      "return the model's outputs from forward");
    if (!output_key_.empty()) {
      for (const auto& [n, s] : user_outputs_)
        if (n == output_key_) output_slot_ = s, output_name_ = n;
      if (output_slot_ < 0)
        throw ConfigError(
            "model.output",
            "'" + output_key_ + "' is not an output of " + path_ + "; it returns " + names,
            "set model.output to one of: " + names);
      return;
    }
    if (user_outputs_.size() == 1) {
      output_slot_ = user_outputs_[0].second;
      output_name_ = user_outputs_[0].first;
      return;
    }
    for (const auto& [n, s] : user_outputs_)
      if (n == "logits") output_slot_ = s, output_name_ = n;
    if (output_slot_ < 0)
      throw ConfigError("model.output",
                        path_ + " returns several outputs (" + names + ") and none is 'logits'",
                        "set model.output to the one the task trains on");
  }

  // Dimension d of the input against the export: a number must match, a symbol lie in its range.
  std::string misfit(int64_t d, int64_t size) const {
    const auto& want = input_meta_.sizes[d];
    if (!want.is_symbol)
      return size == want.value ? ""
                                : "dimension " + std::to_string(d) + " is " + std::to_string(size) +
                                      ", exported as " + std::to_string(want.value);
    auto r = ranges_.find(want.symbol);
    if (r == ranges_.end()) return "";
    const int64_t lo = std::max<int64_t>(r->second.min, 1);
    if (size < lo || (r->second.max && size > *r->second.max))
      return "dimension " + std::to_string(d) + " is " + std::to_string(size) + ", outside " +
             want.symbol + "'s exported range [" + std::to_string(lo) + ", " +
             (r->second.max ? std::to_string(*r->second.max) : "inf") + "]";
    return "";
  }

  void check_sample_shape(const std::vector<int64_t>& shape) {
    if (shape.empty()) return;
    std::vector<int64_t> full = {1};
    full.insert(full.end(), shape.begin(), shape.end());
    std::string why = full.size() != input_meta_.sizes.size()
                          ? "it has " + std::to_string(full.size()) +
                                " dimensions with the batch, the export " +
                                std::to_string(input_meta_.sizes.size())
                          : "";
    for (size_t d = 1; why.empty() && d < full.size(); ++d) why = misfit(int64_t(d), full[d]);
    if (!why.empty())
      throw DataError(path_,
                      "the data's samples " + shape_text(shape) + " (a batch [B, " +
                          shape_text(shape).substr(1) + ") do not fit the exported input '" +
                          user_inputs_[0] + "' " + shape_text(input_meta_.sizes) + ": " + why,
                      "export the model with an input of the data's shape (dynamic_shapes={0: "
                      "Dim('batch')} for the batch), or change the data");
  }

  void check_input(const torch::Tensor& x) {
    std::string why;
    if (x.dim() != int64_t(input_meta_.sizes.size()))
      why = std::to_string(x.dim()) + " dimensions, the export has " +
            std::to_string(input_meta_.sizes.size());
    for (int64_t d = 0; why.empty() && d < x.dim(); ++d) why = misfit(d, x.size(d));
    if (why.empty() && x.scalar_type() != scalar_type(input_meta_.dtype, path_))
      why = std::string("dtype ") + c10::toString(x.scalar_type()) + ", the export takes " +
            formats::pt2_dtype_name(input_meta_.dtype);
    if (why.empty()) return;
    const bool batch = !why.rfind("dimension 0 ", 0) && !input_meta_.sizes[0].is_symbol;
    throw DataError(
        path_,
        "input " + shape_text(x.sizes()) + " does not fit the exported input '" + user_inputs_[0] +
            "' " + shape_text(input_meta_.sizes) + ": " + why,
        batch ? "export with a dynamic batch: dynamic_shapes=({0: torch.export.Dim('batch')},)"
              : "export the model with an input like the data's batches");
  }

  std::string path_, output_key_, output_name_, export_device_ = "cpu";
  NamedTensors params_, buffers_, hidden_;
  // Slots that hold the same value every step: weights, buffers, constants, constant inputs.
  std::vector<std::pair<int, c10::IValue>> fixed_;
  std::map<std::string, std::string> buffer_args_;            // graph input -> buffer name
  std::vector<std::pair<std::string, std::string>> aliases_;  // tied name -> the owner's name
  std::map<std::string, int> slots_;
  int num_slots_ = 0, input_slot_ = -1, output_slot_ = -1;
  std::vector<std::string> user_inputs_;
  std::vector<std::pair<std::string, int>> user_outputs_;
  std::vector<std::pair<int, torch::Tensor>> mutations_;
  formats::TensorMeta input_meta_;
  std::map<std::string, formats::RangeConstraint> ranges_;
  std::vector<Step> steps_;
  bool training_ = true, exported_in_eval_ = false, cl_ = false;
  std::string layout_note_;
  std::string eval_evidence_;
  std::string kernels_;  // what model.script_kernels=mltrain rewrote ("" when off)
};

}  // namespace

std::unique_ptr<Model> make_exported(const config::ModelConfig& c,
                                     const std::vector<int64_t>& sample_shape) {
  if (c.path.empty())
    throw ConfigError(
        "model.path", "model.name=exported needs model.path, the .pt2 file",
        "save one with torch.export.save(torch.export.export(model.train(), (x,)), 'model.pt2')");
  if (!std::filesystem::exists(c.path))
    throw ConfigError(
        "model.path", "exported program '" + c.path + "' not found",
        "save one with torch.export.save(torch.export.export(model.train(), (x,)), 'model.pt2')");
  if (std::filesystem::is_directory(c.path))
    throw ConfigError("model.path", "'" + c.path + "' is a folder; model.path names the .pt2 file");
  return std::make_unique<ExportedModel>(c, sample_shape);
}

}  // namespace mltrain::model
