#pragma once
// torch.export's .pt2 archive (torch.export.save): a zip holding <name>/models/<model>.json (the
// ExportedProgram in the schema of torch/_export/serde/schema.py, major version 8), the weights
// as raw little-endian storages under <name>/data/weights/ with model_weights_config.json naming
// each one's tensor, and lifted constants under <name>/data/constants/. Read into typed values;
// nothing else in mltrain sees the JSON.
//
//   formats::Pt2Program p = formats::read_pt2("model.pt2");        // DataError naming the file
//   for (const auto& n : p.graph.nodes) ... n.target ("torch.ops.aten.conv2d.default"), n.inputs
//   p.read_payload("weight_0", /*constant=*/false, dst);            // a weight's storage
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace mltrain::formats {

class ZipReader;

constexpr int kPt2SchemaMajor = 8;  // the version read; torch 2.15 writes 8.20

// A dimension, a stride or a SymInt argument: a number, or a symbol ("s77") with the value it had
// when exported.
struct SymInt {
  bool is_symbol = false;
  int64_t value = 0;   // the number, or the export-time hint of the symbol
  std::string symbol;  // Symbol('s77', ...) -> "s77"; an expression keeps its text
};

struct TensorMeta {
  int dtype = 0;  // the schema's ScalarType enum (schema.py): 7 float32, 5 int64, ...
  std::vector<SymInt> sizes, strides;
  SymInt storage_offset;
  bool requires_grad = false;
  std::string device = "cpu";
};

// One argument of a node (serde's Argument union), flattened. `names` holds tensor names for
// kTensor / kTensors / kOptionalTensors ("" for a None in the latter) and value names for
// symbolic ints; `ints` the numbers of kInts / kSymInts (where names[i] is empty).
struct Argument {
  enum Kind {
    kNone,
    kTensor,
    kTensors,
    kOptionalTensors,
    kInt,
    kInts,
    kFloat,
    kFloats,
    kBool,
    kBools,
    kString,
    kStrings,
    kSymInt,
    kSymInts,
    kSymFloat,
    kSymBool,
    kScalarType,
    kMemoryFormat,
    kLayout,
    kDevice,
    kOther
  };
  Kind kind = kNone;
  int64_t i = 0;  // kInt, kScalarType, kMemoryFormat, kLayout, kSymInt's number
  double f = 0;
  bool b = false;
  std::string s;  // kString, kDevice ("cpu", "cuda:0"), kOther: the union member's name
  std::vector<std::string> names, strings;
  std::vector<int64_t> ints;
  std::vector<double> floats;
  std::vector<bool> bools;
};

struct NamedArgument {
  std::string name;
  Argument arg;
  bool keyword = false;
};

struct Node {
  std::string name;    // the FX node's name ("conv2d_3"), or "" in old archives
  std::string target;  // "torch.ops.aten.conv2d.default", "_operator.mul", ...
  std::vector<NamedArgument> inputs;
  std::vector<Argument> outputs;
  std::string module_stack;  // nn_module_stack's innermost path ("layer3.1.conv2"), may be ""
  std::string stack_trace;
};

struct Graph {
  std::vector<Argument> inputs, outputs;
  std::vector<Node> nodes;
  std::map<std::string, TensorMeta> tensor_values;
};

// How a graph input is fed: the signature's input specs.
struct InputSpec {
  enum Kind { kUserInput, kParameter, kBuffer, kTensorConstant, kCustomObj, kToken, kConstant };
  Kind kind = kUserInput;
  std::string arg;     // the graph input's name ("p_conv_weight", "x")
  std::string target;  // the module's name for it ("conv.weight"); "" for user inputs
  bool persistent = true;
  Argument constant;  // kConstant: the value (ConstantValue)
};

struct OutputSpec {
  enum Kind { kUserOutput, kLoss, kBufferMutation, kGradient, kUserInputMutation, kToken, kOther };
  Kind kind = kUserOutput;
  Argument arg;
  std::string target;  // the buffer a kBufferMutation writes
};

// A weight or constant stored in the archive: which file holds its storage and how it views it.
struct Payload {
  std::string path_name;  // "weight_0" under data/weights/ (or data/constants/)
  bool is_param = false;
  bool use_pickle = false;  // a tensor subclass saved with torch.save: not read here
  TensorMeta meta;
};

struct RangeConstraint {
  int64_t min = 0;
  std::optional<int64_t> max;  // none: unbounded
};

struct Pt2Program {
  std::string path;   // the archive
  std::string model;  // the model's name inside it ("model")
  int schema_major = 0, schema_minor = 0;
  std::string torch_version;
  Graph graph;
  std::vector<InputSpec> inputs;
  std::vector<OutputSpec> outputs;
  std::map<std::string, RangeConstraint> ranges;  // symbol -> range
  std::vector<std::string> output_leaves;    // the user outputs' names in the pytree (logits, 0..)
  std::map<std::string, Payload> weights;    // module name -> payload
  std::map<std::string, Payload> constants;  // constant name -> payload

  // Size and bytes of data/weights/<path_name> (data/constants/ when `constant`); DataError naming
  // the entry when it is missing; read_payload CRC-checks what it copies into dst.
  uint64_t payload_size(const std::string& path_name, bool constant = false) const;
  void read_payload(const std::string& path_name, bool constant, void* dst) const;
  std::shared_ptr<const ZipReader> zip;
  std::string model_prefix_;  // "<archive>/" every entry of the program sits under
};

// Reads the archive's program and weight tables. DataError (exit 3) naming the file for a file
// that is not a zip, is truncated, holds no exported program (an AOTInductor package: names what
// it holds), or whose schema's major version is not kPt2SchemaMajor (names both).
Pt2Program read_pt2(const std::string& path);

// A schema ScalarType's name for messages ("float32").
const char* pt2_dtype_name(int dtype);

}  // namespace mltrain::formats
