// torch.save(model.state_dict()) files without Python. The file is a zip archive (PyTorch >= 1.6):
// data.pkl (a pickle, protocol 2) and one record per tensor storage (data/<key>). LibTorch 1.13's
// own unpickler turns collections.OrderedDict (which every state_dict is) into None, so this reads
// the pickle itself: a small stack machine for the opcodes torch.save emits, building only dicts,
// tuples, lists, scalars, strings and tensors (_rebuild_tensor_v2 over persistent storages).
// Anything else (a pickled nn.Module, arbitrary classes) is refused by name, never executed.
#include "mltrain/formats/state_dict.hpp"

#include <caffe2/serialize/inline_container.h>

#include <cstring>
#include <memory>
#include <variant>

#include "mltrain/core/error.hpp"

namespace mltrain::formats {

namespace {

struct Value;
using Ref = std::shared_ptr<Value>;
struct Global {
  std::string name;  // "module.qualname"
};
struct Storage {
  at::ScalarType dtype;
  std::string key;
  int64_t numel;
};
struct Value {
  enum Kind {
    kNone,
    kBool,
    kInt,
    kFloat,
    kString,
    kTuple,
    kList,
    kDict,
    kGlobal,
    kStorage,
    kTensor
  };
  Kind kind = kNone;
  int64_t i = 0;
  double f = 0;
  std::string s;
  std::vector<Ref> items;                  // tuple, list
  std::vector<std::pair<Ref, Ref>> pairs;  // dict, in insertion order
  Global global;
  Storage storage{};
  torch::Tensor tensor;
};

Ref make(Value::Kind k) {
  auto v = std::make_shared<Value>();
  v->kind = k;
  return v;
}

at::ScalarType storage_dtype(const std::string& type, const std::string& file) {
  static const std::pair<const char*, at::ScalarType> table[] = {
      {"torch.FloatStorage", at::kFloat}, {"torch.DoubleStorage", at::kDouble},
      {"torch.HalfStorage", at::kHalf},   {"torch.BFloat16Storage", at::kBFloat16},
      {"torch.LongStorage", at::kLong},   {"torch.IntStorage", at::kInt},
      {"torch.ShortStorage", at::kShort}, {"torch.CharStorage", at::kChar},
      {"torch.ByteStorage", at::kByte},   {"torch.BoolStorage", at::kBool}};
  for (const auto& [name, dtype] : table)
    if (type == name) return dtype;
  throw CheckpointError(file, "holds a tensor storage of type " + type + ", which is not supported",
                        "save float, integer or bool tensors");
}

class Reader {
 public:
  Reader(const std::string& file, caffe2::serialize::PyTorchStreamReader& zip, const uint8_t* data,
         size_t size)
      : file_(file), zip_(zip), p_(data), end_(data + size) {}

  Ref run() {
    for (;;) {
      const uint8_t op = byte();
      if (op == '.') return pop();  // STOP
      if (op == 0x80) {             // PROTO
        byte();
        continue;
      }
      if (!scalar(op) && !container(op) && !object(op))
        fail("pickle opcode 0x" + hex(op) + " at byte " + std::to_string(offset_ - 1) +
             " is not one torch.save(state_dict) writes");
    }
  }

 private:
  // Strings, numbers, booleans, None.
  bool scalar(uint8_t op) {
    switch (op) {
      case 'X':     // BINUNICODE
      case 0x8c: {  // SHORT_BINUNICODE
        auto v = make(Value::kString);
        v->s = bytes(op == 'X' ? u32() : byte());
        push(v);
        return true;
      }
      case 'K':
        push(integer(byte()));
        return true;
      case 'M':
        push(integer(u16()));
        return true;
      case 'J':
        push(integer(static_cast<int32_t>(u32())));
        return true;
      case 0x8a:
        push(integer(long1()));
        return true;
      case 'G':
        push(real());
        return true;
      case 0x88:
        push(boolean(true));
        return true;
      case 0x89:
        push(boolean(false));
        return true;
      case 'N':
        push(make(Value::kNone));
        return true;
      default:
        return false;
    }
  }

  // Tuples, lists, dicts, marks and the memo.
  bool container(uint8_t op) {
    switch (op) {
      case '}':
        push(make(Value::kDict));
        return true;
      case ']':
        push(make(Value::kList));
        return true;
      case ')':
        push(make(Value::kTuple));
        return true;
      case '(':
        marks_.push_back(stack_.size());
        return true;
      case 't':
        push(tuple_from(pop_mark()));
        return true;
      case 0x85:
        push(tuple_from(take(1)));
        return true;
      case 0x86:
        push(tuple_from(take(2)));
        return true;
      case 0x87:
        push(tuple_from(take(3)));
        return true;
      case 'q':
        memo_[byte()] = top();
        return true;
      case 'r':
        memo_[u32()] = top();
        return true;
      case 'h':
        push(memo(byte()));
        return true;
      case 'j':
        push(memo(u32()));
        return true;
      case 's': {  // SETITEM
        auto v = pop(), k = pop();
        as_dict(top())->pairs.emplace_back(k, v);
        return true;
      }
      case 'u': {  // SETITEMS
        auto items = pop_mark();
        auto d = as_dict(top());
        for (size_t i = 0; i + 1 < items.size(); i += 2)
          d->pairs.emplace_back(items[i], items[i + 1]);
        return true;
      }
      case 'a': {  // APPEND
        auto v = pop();
        top()->items.push_back(v);
        return true;
      }
      case 'e': {  // APPENDS
        auto items = pop_mark();
        auto l = top();
        l->items.insert(l->items.end(), items.begin(), items.end());
        return true;
      }
      default:
        return false;
    }
  }

  // Globals and what they may build: OrderedDicts and tensors over persistent storages.
  bool object(uint8_t op) {
    switch (op) {
      case 'c': {  // GLOBAL module\nname\n
        auto g = make(Value::kGlobal);
        const std::string module = line();
        g->global.name = module + "." + line();
        push(g);
        return true;
      }
      case 'Q':
        push(persistent(pop()));
        return true;  // BINPERSID
      case 'R': {     // REDUCE
        auto args = pop(), fn = pop();
        push(reduce(fn, args));
        return true;
      }
      case 'b':
        pop();
        return true;  // BUILD: a state_dict's _metadata (versions), not needed
      case 0x81: {    // NEWOBJ: cls.__new__(cls, *args), how pickle makes objects
        pop();
        const auto cls = pop();
        fail("constructs " + (cls->kind == Value::kGlobal ? cls->global.name : "an object") +
             ": not part of a state_dict (a whole pickled module or custom class?)");
      }
      default:
        return false;
    }
  }

  [[noreturn]] void fail(const std::string& why) {
    throw CheckpointError(file_, "data.pkl: " + why,
                          "save the weights with torch.save(model.state_dict(), path)");
  }
  static std::string hex(uint8_t b) {
    const char* d = "0123456789abcdef";
    return {d[b >> 4], d[b & 15]};
  }
  uint8_t byte() {
    if (p_ >= end_) fail("ends in the middle of the pickle");
    ++offset_;
    return *p_++;
  }
  std::string bytes(size_t n) {
    if (static_cast<size_t>(end_ - p_) < n) fail("ends in the middle of the pickle");
    std::string s(reinterpret_cast<const char*>(p_), n);
    p_ += n, offset_ += n;
    return s;
  }
  uint32_t u32() {
    const auto s = bytes(4);
    uint32_t v;
    std::memcpy(&v, s.data(), 4);
    return v;
  }
  uint16_t u16() {
    const auto s = bytes(2);
    return static_cast<uint16_t>(static_cast<uint8_t>(s[0]) | (static_cast<uint8_t>(s[1]) << 8));
  }
  int64_t long1() {
    const size_t n = byte();
    if (n > 8) fail("an integer of " + std::to_string(n) + " bytes");
    const auto s = bytes(n);
    int64_t v = 0;
    for (size_t i = 0; i < n; ++i) v |= static_cast<int64_t>(static_cast<uint8_t>(s[i])) << (8 * i);
    if (n > 0 && n < 8 && (static_cast<uint8_t>(s[n - 1]) & 0x80)) v -= int64_t{1} << (8 * n);
    return v;
  }
  Ref real() {  // BINFLOAT: big-endian double
    const auto s = bytes(8);
    uint64_t bits = 0;
    for (char c : s) bits = (bits << 8) | static_cast<uint8_t>(c);
    auto v = make(Value::kFloat);
    std::memcpy(&v->f, &bits, 8);
    return v;
  }
  std::string line() {
    std::string s;
    for (char c; (c = static_cast<char>(byte())) != '\n';) s += c;
    return s;
  }
  Ref integer(int64_t i) {
    auto v = make(Value::kInt);
    v->i = i;
    return v;
  }
  Ref boolean(bool b) {
    auto v = make(Value::kBool);
    v->i = b;
    return v;
  }
  void push(Ref v) { stack_.push_back(std::move(v)); }
  Ref top() {
    if (stack_.empty()) fail("stack underflow");
    return stack_.back();
  }
  Ref pop() {
    auto v = top();
    stack_.pop_back();
    return v;
  }
  std::vector<Ref> take(size_t n) {
    if (stack_.size() < n) fail("stack underflow");
    std::vector<Ref> out(stack_.end() - static_cast<std::ptrdiff_t>(n), stack_.end());
    stack_.resize(stack_.size() - n);
    return out;
  }
  std::vector<Ref> pop_mark() {
    if (marks_.empty()) fail("no MARK before a collection opcode");
    const size_t m = marks_.back();
    marks_.pop_back();
    return take(stack_.size() - m);
  }
  Ref memo(uint32_t k) {
    auto it = memo_.find(k);
    if (it == memo_.end()) fail("memo entry " + std::to_string(k) + " read before it was written");
    return it->second;
  }
  Ref tuple_from(std::vector<Ref> items) {
    auto t = make(Value::kTuple);
    t->items = std::move(items);
    return t;
  }
  Ref as_dict(const Ref& v) {
    if (v->kind != Value::kDict) fail("SETITEMS on something that is not a dict");
    return v;
  }
  // ('storage', torch.FloatStorage, key, location, numel)
  Ref persistent(const Ref& pid) {
    if (pid->kind != Value::kTuple || pid->items.size() < 5 || pid->items[0]->s != "storage" ||
        pid->items[1]->kind != Value::kGlobal)
      fail("a persistent id that is not a tensor storage");
    auto v = make(Value::kStorage);
    v->storage = {storage_dtype(pid->items[1]->global.name, file_), pid->items[2]->s,
                  pid->items[4]->i};
    return v;
  }
  std::vector<int64_t> ints(const Ref& t) {
    std::vector<int64_t> out;
    for (const auto& e : t->items) out.push_back(e->i);
    return out;
  }
  Ref reduce(const Ref& fn, const Ref& args) {
    if (fn->kind != Value::kGlobal) fail("REDUCE of something that is not a global");
    const std::string& name = fn->global.name;
    if (name == "collections.OrderedDict") return make(Value::kDict);
    if (name == "torch._utils._rebuild_tensor_v2") return rebuild_tensor(args);
    if (name == "torch._utils._rebuild_parameter") return args->items.at(0);
    fail("calls " + name + ": not part of a state_dict (a whole pickled module or custom class?)");
  }
  // _rebuild_tensor_v2(storage, storage_offset, size, stride, requires_grad, backward_hooks)
  Ref rebuild_tensor(const Ref& args) {
    if (args->items.size() < 4 || args->items[0]->kind != Value::kStorage)
      fail("_rebuild_tensor_v2 without a storage");
    const Storage& st = args->items[0]->storage;
    const std::string record = "data/" + st.key;
    if (!zip_.hasRecord(record)) fail("tensor storage " + record + " is missing from the archive");
    auto [ptr, size] = zip_.getRecord(record);
    const size_t need = static_cast<size_t>(st.numel) * c10::elementSize(st.dtype);
    if (size < need)
      fail(record + " holds " + std::to_string(size) + " bytes, needs " + std::to_string(need));
    auto storage =
        torch::from_blob(ptr.get(), {st.numel}, torch::TensorOptions().dtype(st.dtype)).clone();
    const auto sizes = ints(args->items[2]), strides = ints(args->items[3]);
    if (sizes.size() != strides.size()) fail("a tensor's sizes and strides differ in rank");
    int64_t last = args->items[1]->i;
    bool empty = false;
    for (size_t d = 0; d < sizes.size(); ++d) {
      empty = empty || sizes[d] == 0;
      last += (sizes[d] - 1) * strides[d];
    }
    if (!empty && (last < 0 || last >= st.numel))
      fail("a tensor view reaches past its storage (" + record + ")");
    auto v = make(Value::kTensor);
    v->tensor = storage.as_strided(sizes, strides, args->items[1]->i).clone();
    return v;
  }

  std::string file_;
  caffe2::serialize::PyTorchStreamReader& zip_;
  const uint8_t* p_;
  const uint8_t* end_;
  size_t offset_ = 0;
  std::vector<Ref> stack_;
  std::vector<size_t> marks_;
  std::map<uint32_t, Ref> memo_;
};

}  // namespace

std::map<std::string, torch::Tensor> read_torch_save(const std::string& path) {
  std::unique_ptr<caffe2::serialize::PyTorchStreamReader> zip;
  try {
    zip = std::make_unique<caffe2::serialize::PyTorchStreamReader>(path);
  } catch (const c10::Error&) {
    throw CheckpointError(path,
                          "is neither safetensors, an mltrain checkpoint nor a torch.save zip "
                          "archive (PyTorch >= 1.6)",
                          "save the weights with torch.save(model.state_dict(), path)");
  }
  if (!zip->hasRecord("data.pkl"))
    throw CheckpointError(path, "is a zip archive without data.pkl: not written by torch.save",
                          "save the weights with torch.save(model.state_dict(), path)");
  auto [pkl, size] = zip->getRecord("data.pkl");
  Reader reader(path, *zip, static_cast<const uint8_t*>(pkl.get()), size);
  const Ref root = reader.run();
  if (root->kind != Value::kDict)
    throw CheckpointError(path, "holds a pickled object that is not a dict: not a state_dict",
                          "save the weights with torch.save(model.state_dict(), path)");
  std::map<std::string, torch::Tensor> out;
  for (const auto& [k, v] : root->pairs) {
    if (k->kind != Value::kString || v->kind != Value::kTensor)
      throw CheckpointError(path, "is a dict, but not of names to tensors (a state_dict)",
                            "save the weights with torch.save(model.state_dict(), path)");
    out[k->s] = v->tensor;
  }
  return out;
}

}  // namespace mltrain::formats
