#include "mltrain/formats/pt2.hpp"

#include <nlohmann/json.hpp>

#include <functional>

#include "mltrain/core/error.hpp"
#include "mltrain/core/json.hpp"
#include "mltrain/formats/zip.hpp"

namespace mltrain::formats {
namespace {
using json = nlohmann::json;

// The union members of serde's Argument that carry no value mltrain uses are kept as kOther with
// their member's name, so the interpreter can name them in its error.
SymInt sym_int(const json& j) {
  SymInt s;
  if (j.contains("as_int")) {
    s.value = json_int(j.at("as_int"));
    return s;
  }
  const json& e = j.at("as_expr");
  s.is_symbol = true;
  std::string text = e.at("expr_str").get<std::string>();
  // "Symbol('s77', positive=True, integer=True)" -> "s77"; any other expression stays whole.
  const std::string head = "Symbol('";
  if (text.rfind(head, 0) == 0 && text.find('\'', head.size()) != std::string::npos)
    text = text.substr(head.size(), text.find('\'', head.size()) - head.size());
  s.symbol = text;
  if (e.contains("hint") && e.at("hint").is_object() && e.at("hint").contains("as_int"))
    s.value = json_int(e.at("hint").at("as_int"));
  return s;
}

std::string device(const json& d) {
  std::string s = d.at("type").get<std::string>();
  if (d.contains("index") && !d.at("index").is_null())
    s += ":" + std::to_string(json_int(d.at("index")));
  return s;
}

TensorMeta tensor_meta(const json& j) {
  TensorMeta m;
  m.dtype = int(json_int(j.at("dtype")));
  for (const auto& s : j.at("sizes")) m.sizes.push_back(sym_int(s));
  for (const auto& s : j.at("strides")) m.strides.push_back(sym_int(s));
  if (j.contains("storage_offset")) m.storage_offset = sym_int(j.at("storage_offset"));
  m.requires_grad = j.value("requires_grad", false);
  if (j.contains("device")) m.device = device(j.at("device"));
  return m;
}

std::string tensor_name(const json& j) { return j.at("name").get<std::string>(); }

Argument argument(const json& j) {
  Argument a;
  if (!j.is_object() || j.size() != 1)
    throw json::type_error::create(302, "an Argument is a one-member object", &j);
  const std::string key = j.begin().key();
  const json& v = j.begin().value();
  using K = Argument::Kind;
  if (key == "as_none")
    a.kind = K::kNone;
  else if (key == "as_tensor")
    a.kind = K::kTensor, a.names = {tensor_name(v)};
  else if (key == "as_tensors") {
    a.kind = K::kTensors;
    for (const auto& t : v) a.names.push_back(tensor_name(t));
  } else if (key == "as_optional_tensors") {
    a.kind = K::kOptionalTensors;
    for (const auto& t : v)
      a.names.push_back(t.contains("as_tensor") ? tensor_name(t.at("as_tensor")) : "");
  } else if (key == "as_optional_tensor") {
    if (v.contains("as_tensor"))
      a.kind = K::kTensor, a.names = {tensor_name(v.at("as_tensor"))};
    else
      a.kind = K::kNone;
  } else if (key == "as_int")
    a.kind = K::kInt, a.i = json_int(v);
  else if (key == "as_ints")
    a.kind = K::kInts, a.ints = json_ints(v);
  else if (key == "as_float")
    a.kind = K::kFloat, a.f = v.get<double>();
  else if (key == "as_floats")
    a.kind = K::kFloats, a.floats = v.get<std::vector<double>>();
  else if (key == "as_bool")
    a.kind = K::kBool, a.b = v.get<bool>();
  else if (key == "as_bools")
    a.kind = K::kBools, a.bools = v.get<std::vector<bool>>();
  else if (key == "as_string")
    a.kind = K::kString, a.s = v.get<std::string>();
  else if (key == "as_strings")
    a.kind = K::kStrings, a.strings = v.get<std::vector<std::string>>();
  else if (key == "as_sym_int") {
    a.kind = K::kSymInt;
    if (v.contains("as_name"))
      a.names = {v.at("as_name").get<std::string>()};
    else
      a.i = json_int(v.at("as_int"));
  } else if (key == "as_sym_ints") {
    a.kind = K::kSymInts;
    for (const auto& e : v) {
      if (e.contains("as_name"))
        a.names.push_back(e.at("as_name").get<std::string>()), a.ints.push_back(0);
      else
        a.names.push_back(""), a.ints.push_back(json_int(e.at("as_int")));
    }
  } else if (key == "as_sym_float") {
    a.kind = K::kSymFloat;
    if (v.contains("as_name"))
      a.names = {v.at("as_name").get<std::string>()};
    else
      a.f = v.at("as_float").get<double>();
  } else if (key == "as_sym_bool") {
    a.kind = K::kSymBool;
    if (v.contains("as_name"))
      a.names = {v.at("as_name").get<std::string>()};
    else
      a.b = v.at("as_bool").get<bool>();
  } else if (key == "as_scalar_type")
    a.kind = K::kScalarType, a.i = json_int(v);
  else if (key == "as_memory_format")
    a.kind = K::kMemoryFormat, a.i = json_int(v);
  else if (key == "as_layout")
    a.kind = K::kLayout, a.i = json_int(v);
  else if (key == "as_device")
    a.kind = K::kDevice, a.s = device(v);
  else
    a.kind = K::kOther, a.s = key;
  return a;
}

// The innermost module of nn_module_stack ("L__self__,,M;L__self__conv,conv,Conv2d" -> "conv").
std::string module_path(const std::string& stack) {
  const size_t last = stack.rfind(';');
  const std::string entry = last == std::string::npos ? stack : stack.substr(last + 1);
  const size_t a = entry.find(','), b = entry.rfind(',');
  if (a == std::string::npos || b == a) return "";
  return entry.substr(a + 1, b - a - 1);
}

// Leaf names of a pytree spec (torch.utils._pytree's treespec_dumps): dict-like nodes name their
// children by key, sequences by position; a lone leaf is "".
void leaves(const json& node, const std::string& prefix, std::vector<std::string>& out) {
  const json& children = node.at("children_spec");
  if (node.at("type").is_null() || children.empty()) {
    if (node.at("type").is_null()) out.push_back(prefix);
    return;
  }
  std::vector<std::string> keys;
  const json& ctx = node.at("context");
  if (ctx.is_string() && !ctx.get<std::string>().empty()) {
    const json parsed = json::parse(ctx.get<std::string>(), nullptr, /*allow_exceptions=*/false);
    if (parsed.is_array())
      for (const auto& k : parsed) keys.push_back(k.is_string() ? k.get<std::string>() : k.dump());
  }
  for (size_t i = 0; i < children.size(); ++i) {
    const std::string key = i < keys.size() ? keys[i] : std::to_string(i);
    leaves(children[i], prefix.empty() ? key : prefix + "." + key, out);
  }
}

Payload payload(const json& j) {
  Payload p;
  p.path_name = j.at("path_name").get<std::string>();
  p.is_param = j.value("is_param", false);
  p.use_pickle = j.value("use_pickle", false);
  if (j.contains("tensor_meta") && !j.at("tensor_meta").is_null())
    p.meta = tensor_meta(j.at("tensor_meta"));
  return p;
}

void parse_program(const json& j, Pt2Program& p) {
  const json& version = j.at("schema_version");
  p.schema_major = int(json_int(version.at("major")));
  p.schema_minor = int(json_int(version.at("minor")));
  if (p.schema_major != kPt2SchemaMajor)
    throw DataError(p.path,
                    "exported with graph schema version " + std::to_string(p.schema_major) + "." +
                        std::to_string(p.schema_minor) + "; mltrain reads major version " +
                        std::to_string(kPt2SchemaMajor) + " (PyTorch 2.15 writes 8.20)",
                    "export the model again with PyTorch 2.15 (torch.export.export, then "
                    "torch.export.save)");
  p.torch_version = j.value("torch_version", "");
  const json& gm = j.at("graph_module");
  const json& g = gm.at("graph");
  for (const auto& a : g.at("inputs")) p.graph.inputs.push_back(argument(a));
  for (const auto& a : g.at("outputs")) p.graph.outputs.push_back(argument(a));
  for (const auto& [name, meta] : g.at("tensor_values").items())
    p.graph.tensor_values[name] = tensor_meta(meta);
  for (const auto& n : g.at("nodes")) {
    Node node;
    node.target = n.at("target").get<std::string>();
    if (n.contains("name") && n.at("name").is_string()) node.name = n.at("name").get<std::string>();
    for (const auto& in : n.at("inputs")) {
      NamedArgument na;
      na.name = in.at("name").get<std::string>();
      na.arg = argument(in.at("arg"));
      na.keyword = in.contains("kind") && in.at("kind").is_number() && json_int(in.at("kind")) == 2;
      node.inputs.push_back(std::move(na));
    }
    for (const auto& out : n.at("outputs")) node.outputs.push_back(argument(out));
    if (n.contains("metadata") && n.at("metadata").is_object()) {
      const json& md = n.at("metadata");
      if (md.contains("nn_module_stack") && md.at("nn_module_stack").is_string())
        node.module_stack = module_path(md.at("nn_module_stack").get<std::string>());
      if (md.contains("stack_trace") && md.at("stack_trace").is_string())
        node.stack_trace = md.at("stack_trace").get<std::string>();
    }
    p.graph.nodes.push_back(std::move(node));
  }
  const json& sig = gm.at("signature");
  for (const auto& s : sig.at("input_specs")) {
    InputSpec in;
    if (!s.is_object() || s.size() != 1)
      throw json::type_error::create(302, "an input spec is a one-member object", &s);
    const std::string key = s.begin().key();
    const json& v = s.begin().value();
    if (key == "user_input") {
      in.kind = InputSpec::kUserInput;
      const Argument a = argument(v.at("arg"));
      in.arg = a.names.empty() ? "" : a.names[0];
      in.constant = a;
    } else if (key == "parameter") {
      in.kind = InputSpec::kParameter;
      in.arg = tensor_name(v.at("arg"));
      in.target = v.at("parameter_name").get<std::string>();
    } else if (key == "buffer") {
      in.kind = InputSpec::kBuffer;
      in.arg = tensor_name(v.at("arg"));
      in.target = v.at("buffer_name").get<std::string>();
      in.persistent = v.value("persistent", true);
    } else if (key == "tensor_constant") {
      in.kind = InputSpec::kTensorConstant;
      in.arg = tensor_name(v.at("arg"));
      in.target = v.at("tensor_constant_name").get<std::string>();
    } else if (key == "custom_obj") {
      in.kind = InputSpec::kCustomObj;
      in.arg = v.at("arg").at("name").get<std::string>();
      in.target = v.at("custom_obj_name").get<std::string>();
    } else if (key == "token") {
      in.kind = InputSpec::kToken;
      in.arg = v.at("arg").at("name").get<std::string>();
    } else if (key == "constant_input") {
      in.kind = InputSpec::kConstant;
      in.arg = v.at("name").get<std::string>();
      in.constant = argument(v.at("value"));
    } else {
      throw DataError(
          p.path, "the graph signature has an input of kind '" + key + "' mltrain does not know");
    }
    p.inputs.push_back(std::move(in));
  }
  for (const auto& s : sig.at("output_specs")) {
    OutputSpec out;
    if (!s.is_object() || s.size() != 1)
      throw json::type_error::create(302, "an output spec is a one-member object", &s);
    const std::string key = s.begin().key();
    const json& v = s.begin().value();
    out.kind = key == "user_output"             ? OutputSpec::kUserOutput
               : key == "loss_output"           ? OutputSpec::kLoss
               : key == "buffer_mutation"       ? OutputSpec::kBufferMutation
               : key == "gradient_to_parameter" ? OutputSpec::kGradient
               : key == "user_input_mutation"   ? OutputSpec::kUserInputMutation
               : key == "token"                 ? OutputSpec::kToken
                                                : OutputSpec::kOther;
    if (key == "token")
      out.arg.kind = Argument::kOther, out.arg.s = "token";
    else if (v.at("arg").contains("name"))
      out.arg.kind = Argument::kTensor, out.arg.names = {tensor_name(v.at("arg"))};
    else
      out.arg = argument(v.at("arg"));
    if (v.contains("buffer_name")) out.target = v.at("buffer_name").get<std::string>();
    p.outputs.push_back(std::move(out));
  }
  if (j.contains("range_constraints"))
    for (const auto& [sym, r] : j.at("range_constraints").items()) {
      RangeConstraint rc;
      if (r.contains("min_val") && !r.at("min_val").is_null()) rc.min = json_int(r.at("min_val"));
      if (r.contains("max_val") && !r.at("max_val").is_null()) rc.max = json_int(r.at("max_val"));
      p.ranges[sym] = rc;
    }
  if (gm.contains("module_call_graph"))
    for (const auto& entry : gm.at("module_call_graph")) {
      if (entry.value("fqn", std::string("?")) != "" || !entry.contains("signature") ||
          entry.at("signature").is_null())
        continue;
      const json spec = json::parse(entry.at("signature").at("out_spec").get<std::string>());
      if (spec.is_array() && spec.size() == 2) leaves(spec[1], "", p.output_leaves);
    }
}

[[noreturn]] void json_error(const std::string& path, const std::string& entry,
                             const std::exception& e) {
  throw DataError(path, entry + ": not the exported-program JSON mltrain reads (" + e.what() + ")",
                  "save the program with torch.export.save from PyTorch 2.15");
}
}  // namespace

const char* pt2_dtype_name(int dtype) {
  switch (dtype) {
    case 1:
      return "uint8";
    case 2:
      return "int8";
    case 3:
      return "int16";
    case 4:
      return "int32";
    case 5:
      return "int64";
    case 6:
      return "float16";
    case 7:
      return "float32";
    case 8:
      return "float64";
    case 12:
      return "bool";
    case 13:
      return "bfloat16";
    default:
      return "another dtype";
  }
}

namespace {
const ZipEntry& payload_entry(const Pt2Program& p, const std::string& path_name, bool constant) {
  const std::string entry =
      p.model_prefix_ + (constant ? "data/constants/" : "data/weights/") + path_name;
  const ZipEntry* e = p.zip->find(entry);
  if (!e)
    throw DataError(p.path, "weight file '" + entry + "' is missing from the archive",
                    "save the program again with torch.export.save");
  return *e;
}
}  // namespace

uint64_t Pt2Program::payload_size(const std::string& path_name, bool constant) const {
  return payload_entry(*this, path_name, constant).size;
}

void Pt2Program::read_payload(const std::string& path_name, bool constant, void* dst) const {
  zip->read_into(payload_entry(*this, path_name, constant), dst);
}

Pt2Program read_pt2(const std::string& path) {
  Pt2Program p;
  p.path = path;
  auto zip = std::make_shared<ZipReader>(path);
  // <archive>/models/<model>.json; <archive> is the folder every entry sits in.
  std::string model_json;
  bool aoti = false;
  for (const auto& e : zip->entries()) {
    const size_t at = e.name.find("/models/");
    if (at != std::string::npos && e.name.size() > 5 &&
        e.name.compare(e.name.size() - 5, 5, ".json") == 0 &&
        e.name.find('/', at + 8) == std::string::npos) {
      if (model_json.empty() || e.name.substr(at + 8) == "model.json") model_json = e.name;
    }
    if (e.name.find("/data/aotinductor/") != std::string::npos) aoti = true;
  }
  if (model_json.empty()) {
    if (aoti)
      throw DataError(path,
                      "an AOTInductor package (compiled code for inference) with no exported "
                      "program to train",
                      "save the program itself: torch.export.save(torch.export.export(model, "
                      "args), path), not torch._inductor.aoti_compile_and_package");
    throw DataError(path, "a zip archive with no models/*.json: not a torch.export .pt2 file",
                    "save one with torch.export.save(torch.export.export(model, args), path)");
  }
  const size_t at = model_json.find("/models/");
  p.model_prefix_ = model_json.substr(0, at + 1);
  p.model = model_json.substr(at + 8, model_json.size() - at - 8 - 5);
  try {
    parse_program(json::parse(zip->read(model_json)), p);
  } catch (const json::exception& e) {
    json_error(path, model_json, e);
  }
  const std::string weights = p.model_prefix_ + "data/weights/" + p.model + "_weights_config.json";
  const std::string constants =
      p.model_prefix_ + "data/constants/" + p.model + "_constants_config.json";
  try {
    // Parsed into locals: a range-for over a temporary's items() would read freed memory.
    if (zip->find(weights)) {
      const json table = json::parse(zip->read(weights));
      for (const auto& [name, v] : table.at("config").items()) p.weights[name] = payload(v);
    }
    if (zip->find(constants)) {
      const json table = json::parse(zip->read(constants));
      for (const auto& [name, v] : table.at("config").items()) p.constants[name] = payload(v);
    }
  } catch (const json::exception& e) {
    json_error(path, weights, e);
  }
  p.zip = std::move(zip);
  return p;
}

}  // namespace mltrain::formats
