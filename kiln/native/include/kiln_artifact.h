// kiln::Artifact: a model `kiln.export` wrote (docs/deploy.md), run from C++ without Python.
//
//   kiln::Artifact a("bert.kiln");
//   std::vector<at::Tensor> outs = a.run({{"input_ids", ids}, {"attention_mask", mask}});
//
// The constructor checks the artifact's format and torch version against the libtorch it is
// built with, reads metadata.json, checks the SHA-256 digests it records for model.so and
// weights.safetensors, maps the weights (no copy of those stored in the layout they run in) and
// opens model.so; `run` checks the inputs (names, dtypes, shapes) and returns the outputs in
// metadata order (output_0, ...). Errors are std::runtime_error with the reason. Header-only;
// needs libtorch and -ldl.
#pragma once
#include <ATen/ATen.h>
#include <torch/version.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace kiln {

// ---- a small JSON reader (metadata.json and safetensors headers) ------------------------------
struct Json {
  enum Kind { Null, Bool, Number, String, Array, Object } kind = Null;
  double number = 0;
  bool boolean = false;
  std::string text;
  std::vector<Json> items;
  std::vector<std::pair<std::string, Json>> fields;

  const Json& operator[](const std::string& key) const {
    for (const auto& f : fields)
      if (f.first == key) return f.second;
    throw std::runtime_error("kiln: missing JSON field '" + key + "'");
  }
  bool has(const std::string& key) const {
    for (const auto& f : fields)
      if (f.first == key) return true;
    return false;
  }
  int64_t integer() const { return static_cast<int64_t>(number); }
};

class JsonParser {
 public:
  explicit JsonParser(const std::string& s) : s_(s) {}
  Json parse() {
    Json v = value();
    space();
    if (i_ != s_.size()) fail("trailing characters");
    return v;
  }

 private:
  const std::string& s_;
  size_t i_ = 0;
  [[noreturn]] void fail(const char* what) { throw std::runtime_error(std::string("kiln: bad JSON: ") + what); }
  void space() {
    while (i_ < s_.size() && std::isspace(static_cast<unsigned char>(s_[i_]))) ++i_;
  }
  void expect(char c) {
    space();
    if (i_ >= s_.size() || s_[i_] != c) fail("unexpected character");
    ++i_;
  }
  Json value() {
    space();
    if (i_ >= s_.size()) fail("unexpected end");
    char c = s_[i_];
    Json v;
    if (c == '{') {
      v.kind = Json::Object;
      ++i_;
      space();
      if (s_[i_] == '}') { ++i_; return v; }
      while (true) {
        space();
        std::string key = string();
        expect(':');
        v.fields.emplace_back(key, value());
        space();
        if (s_[i_] == ',') { ++i_; continue; }
        expect('}');
        return v;
      }
    }
    if (c == '[') {
      v.kind = Json::Array;
      ++i_;
      space();
      if (s_[i_] == ']') { ++i_; return v; }
      while (true) {
        v.items.push_back(value());
        space();
        if (s_[i_] == ',') { ++i_; continue; }
        expect(']');
        return v;
      }
    }
    if (c == '"') { v.kind = Json::String; v.text = string(); return v; }
    if (s_.compare(i_, 4, "true") == 0) { v.kind = Json::Bool; v.boolean = true; i_ += 4; return v; }
    if (s_.compare(i_, 5, "false") == 0) { v.kind = Json::Bool; i_ += 5; return v; }
    if (s_.compare(i_, 4, "null") == 0) { i_ += 4; return v; }
    size_t used = 0;
    v.kind = Json::Number;
    v.number = std::stod(s_.substr(i_, 32), &used);
    if (used == 0) fail("not a value");
    i_ += used;
    return v;
  }
  std::string string() {
    if (s_[i_] != '"') fail("expected a string");
    ++i_;
    std::string out;
    while (i_ < s_.size() && s_[i_] != '"') {
      if (s_[i_] == '\\') {
        ++i_;
        char e = s_[i_];
        out += e == 'n' ? '\n' : e == 't' ? '\t' : e;  // kiln writes no other escapes in names
      } else {
        out += s_[i_];
      }
      ++i_;
    }
    ++i_;
    return out;
  }
};

inline std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw std::runtime_error("kiln: cannot read " + path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

// A file mapped copy-on-write: tensors over it share its pages until one is written.
struct MappedFile {
  void* base = nullptr;
  size_t size = 0;
  MappedFile() = default;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile() {
    if (base != nullptr) munmap(base, size);
  }
  const char* data() const { return static_cast<const char*>(base); }
};

inline std::shared_ptr<MappedFile> map_file(const std::string& path) {
  int fd = open(path.c_str(), O_RDONLY);
  if (fd < 0) throw std::runtime_error("kiln: cannot read " + path);
  struct stat st;
  if (fstat(fd, &st) != 0) {
    close(fd);
    throw std::runtime_error("kiln: cannot read " + path);
  }
  auto mapped = std::make_shared<MappedFile>();
  mapped->size = static_cast<size_t>(st.st_size);
  if (mapped->size > 0) {
    void* base = mmap(nullptr, mapped->size, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
    if (base == MAP_FAILED) {
      close(fd);
      throw std::runtime_error("kiln: cannot map " + path);
    }
    mapped->base = base;
  }
  close(fd);
  return mapped;
}

// ---- SHA-256 (FIPS 180-4), to check the digests metadata.json records ----------------------------
class Sha256 {
 public:
  void update(const void* data, size_t n) {
    const auto* p = static_cast<const uint8_t*>(data);
    length_ += n;
    while (n > 0) {
      size_t take = std::min(n, size_t(64) - used_);
      std::memcpy(block_ + used_, p, take);
      used_ += take, p += take, n -= take;
      if (used_ == 64) compress(block_), used_ = 0;
    }
  }
  std::string hex() {
    uint64_t bits = length_ * 8;
    uint8_t pad = 0x80;
    update(&pad, 1);
    uint8_t zero = 0;
    while (used_ != 56) update(&zero, 1);
    uint8_t tail[8];
    for (int k = 0; k < 8; ++k) tail[k] = uint8_t(bits >> (56 - 8 * k));
    update(tail, 8);
    static const char* digits = "0123456789abcdef";
    std::string out;
    for (uint32_t word : h_)
      for (int k = 28; k >= 0; k -= 4) out += digits[(word >> k) & 15];
    return out;
  }

 private:
  static uint32_t rotr(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }
  void compress(const uint8_t* b) {
    static const uint32_t k[64] = {
        0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5, 0xd807aa98,
        0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786,
        0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da, 0x983e5152, 0xa831c66d, 0xb00327c8,
        0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13,
        0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819,
        0xd6990624, 0xf40e3585, 0x106aa070, 0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a,
        0x5b9cca4f, 0x682e6ff3, 0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7,
        0xc67178f2};
    uint32_t w[64];
    for (int t = 0; t < 16; ++t)
      w[t] = uint32_t(b[4 * t]) << 24 | uint32_t(b[4 * t + 1]) << 16 | uint32_t(b[4 * t + 2]) << 8 | b[4 * t + 3];
    for (int t = 16; t < 64; ++t) {
      uint32_t s0 = rotr(w[t - 15], 7) ^ rotr(w[t - 15], 18) ^ (w[t - 15] >> 3);
      uint32_t s1 = rotr(w[t - 2], 17) ^ rotr(w[t - 2], 19) ^ (w[t - 2] >> 10);
      w[t] = w[t - 16] + s0 + w[t - 7] + s1;
    }
    uint32_t a = h_[0], bb = h_[1], c = h_[2], d = h_[3], e = h_[4], f = h_[5], g = h_[6], h = h_[7];
    for (int t = 0; t < 64; ++t) {
      uint32_t t1 = h + (rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)) + ((e & f) ^ (~e & g)) + k[t] + w[t];
      uint32_t t2 = (rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)) + ((a & bb) ^ (a & c) ^ (bb & c));
      h = g, g = f, f = e, e = d + t1, d = c, c = bb, bb = a, a = t1 + t2;
    }
    h_[0] += a, h_[1] += bb, h_[2] += c, h_[3] += d, h_[4] += e, h_[5] += f, h_[6] += g, h_[7] += h;
  }
  uint32_t h_[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
  uint8_t block_[64];
  size_t used_ = 0;
  uint64_t length_ = 0;
};

inline std::string sha256_hex(const MappedFile& file) {
  Sha256 sha;
  sha.update(file.data(), file.size);
  return sha.hex();
}

// ---- safetensors ----------------------------------------------------------------------------------
inline at::ScalarType dtype_of(const std::string& name) {
  static const std::map<std::string, at::ScalarType> names = {
      {"F32", at::kFloat}, {"F64", at::kDouble}, {"F16", at::kHalf}, {"BF16", at::kBFloat16}, {"I64", at::kLong},
      {"I32", at::kInt}, {"I16", at::kShort}, {"I8", at::kChar}, {"U8", at::kByte}, {"BOOL", at::kBool},
      {"float32", at::kFloat}, {"float64", at::kDouble}, {"float16", at::kHalf}, {"bfloat16", at::kBFloat16},
      {"int64", at::kLong}, {"int32", at::kInt}, {"int16", at::kShort}, {"int8", at::kChar}, {"uint8", at::kByte},
      {"bool", at::kBool}};
  auto found = names.find(name);
  if (found == names.end()) throw std::runtime_error("kiln: unknown dtype " + name);
  return found->second;
}

inline std::string safetensors_name(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return "F32";
    case at::kDouble: return "F64";
    case at::kHalf: return "F16";
    case at::kBFloat16: return "BF16";
    case at::kLong: return "I64";
    case at::kInt: return "I32";
    case at::kShort: return "I16";
    case at::kChar: return "I8";
    case at::kByte: return "U8";
    case at::kBool: return "BOOL";
    default: throw std::runtime_error("kiln: cannot store dtype in safetensors");
  }
}

// The tensors of a safetensors file, over its mapping (`mapped`: what map_file gave for `path`;
// each tensor keeps it alive).
inline std::vector<std::pair<std::string, at::Tensor>> load_safetensors(const std::string& path,
                                                                        std::shared_ptr<MappedFile> mapped) {
  const char* data = mapped->data();
  if (mapped->size < 8) throw std::runtime_error("kiln: " + path + " is not a safetensors file");
  uint64_t size = 0;
  std::memcpy(&size, data, 8);
  if (size > mapped->size - 8) throw std::runtime_error("kiln: " + path + " is truncated");
  std::string header_text(data + 8, size);
  Json header = JsonParser(header_text).parse();
  std::vector<std::pair<std::string, at::Tensor>> out;
  size_t start = 8 + size;
  for (const auto& [name, entry] : header.fields) {
    if (name == "__metadata__") continue;
    std::vector<int64_t> shape;
    for (const auto& d : entry["shape"].items) shape.push_back(d.integer());
    int64_t begin = entry["data_offsets"].items.at(0).integer(), end = entry["data_offsets"].items.at(1).integer();
    if (begin < 0 || end < begin || start + end > mapped->size)
      throw std::runtime_error("kiln: " + path + ": tensor " + name + " has bytes outside the file");
    auto options = at::TensorOptions().dtype(dtype_of(entry["dtype"].text));
    int64_t elements = 1;
    for (int64_t d : shape) elements *= d;
    if (elements * static_cast<int64_t>(c10::elementSize(options.dtype().toScalarType())) != end - begin)
      throw std::runtime_error("kiln: " + path + ": tensor " + name + " has the wrong number of bytes");
    char* bytes = static_cast<char*>(mapped->base) + start + begin;
    at::Tensor t;
    if (end == begin) {
      t = at::empty(shape, options);
    } else if (reinterpret_cast<uintptr_t>(bytes) % options.dtype().itemsize() == 0) {
      t = at::from_blob(bytes, shape, [mapped](void*) {}, options);  // (the mapping lives as long as the tensor)
    } else {
      // safetensors packs tensors without gaps: after a bool tensor of odd length the next one's
      // bytes are misaligned for its type, which compiled loops may not read. A copy is aligned.
      t = at::empty(shape, options);
      std::memcpy(t.data_ptr(), bytes, end - begin);
    }
    out.emplace_back(name, t);
  }
  return out;
}

inline std::vector<std::pair<std::string, at::Tensor>> load_safetensors(const std::string& path) {
  return load_safetensors(path, map_file(path));
}

inline void save_safetensors(const std::string& path, const std::vector<std::pair<std::string, at::Tensor>>& tensors) {
  std::string header = "{";
  int64_t offset = 0;
  std::vector<at::Tensor> contiguous;
  for (size_t k = 0; k < tensors.size(); ++k) {
    at::Tensor t = tensors[k].second.contiguous();
    contiguous.push_back(t);
    header += (k ? "," : "") + std::string("\"") + tensors[k].first + "\":{\"dtype\":\"" + safetensors_name(t.scalar_type()) +
              "\",\"shape\":[";
    for (int64_t d = 0; d < t.dim(); ++d) header += (d ? "," : "") + std::to_string(t.size(d));
    header += "],\"data_offsets\":[" + std::to_string(offset) + "," + std::to_string(offset + t.nbytes()) + "]}";
    offset += t.nbytes();
  }
  header += "}";
  while (header.size() % 8) header += ' ';
  std::ofstream f(path, std::ios::binary);
  uint64_t size = header.size();
  f.write(reinterpret_cast<const char*>(&size), 8);
  f.write(header.data(), header.size());
  for (const auto& t : contiguous) f.write(static_cast<const char*>(t.data_ptr()), t.nbytes());
  if (!f) throw std::runtime_error("kiln: cannot write " + path);
}

// ---- the CPU ---------------------------------------------------------------------------------------
// This CPU's extensions as /proc/cpuinfo lists them (x86 `flags`, aarch64 `Features`).
inline std::vector<std::string> cpu_extensions() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line)) {
    std::string key = line.substr(0, line.find(':'));
    key.erase(key.find_last_not_of(" \t") + 1);
    if (key != "flags" && key != "Features") continue;
    std::istringstream words(line.substr(line.find(':') + 1));
    std::vector<std::string> out;
    for (std::string w; words >> w;) out.push_back(w);
    return out;
  }
  return {};
}

// Those of `recorded` (metadata's isa_flags) this CPU lacks, comma-separated; the architecture
// first when `arch` names another.
inline std::string missing_extensions(const Json& recorded, const std::string& arch) {
#if defined(__x86_64__)
  const std::string here_arch = "x86_64";
#elif defined(__aarch64__)
  const std::string here_arch = "aarch64";
#else
  const std::string here_arch = arch;
#endif
  if (!arch.empty() && arch != here_arch) return "the " + arch + " architecture (this machine is " + here_arch + ")";
  std::vector<std::string> here = cpu_extensions();
  std::string out;
  for (const auto& flag : recorded.items)
    if (std::find(here.begin(), here.end(), flag.text) == here.end()) out += (out.empty() ? "" : ", ") + flag.text;
  return out;
}

// ---- the artifact ---------------------------------------------------------------------------------
class Artifact {
 public:
  explicit Artifact(const std::string& dir) : dir_(dir) {
    metadata_ = JsonParser(read_file(dir + "/metadata.json")).parse();
    if (metadata_["format"].integer() != 1)
      throw std::runtime_error("kiln: " + dir + " has artifact format " + std::to_string(metadata_["format"].integer()) +
                               "; this runner reads format 1");
    std::string built = metadata_["torch_version"].text, here = TORCH_VERSION;
    if (built.rfind(here, 0) != 0)
      throw std::runtime_error("kiln: " + dir + " was built for torch version '" + built + "'; this runner has '" + here +
                               "': export the model again");
    if (metadata_.has("isa_flags")) {
      // The extensions of the CPU it was built on (-march=native there), all needed here
      // (kiln/deploy/isa.py).
      std::string lacking = missing_extensions(metadata_["isa_flags"], metadata_.has("arch") ? metadata_["arch"].text : "");
      if (!lacking.empty())
        throw std::runtime_error("kiln: " + dir + " was built for the CPU instruction set of " + metadata_["cpu"].text +
                                 " (-march=native there); this CPU lacks " + lacking + ": export the model again here");
    }
#ifdef KILN_ISA
    // An artifact of an earlier kiln: what -march=native resolved to where the runner was built
    // (kiln build-runner defines it).
    else if (metadata_["isa"].text != KILN_ISA)
      throw std::runtime_error("kiln: " + dir + " was built for CPU instruction set '" + metadata_["isa"].text + "' on " +
                               metadata_["cpu"].text + "; this runner has '" + KILN_ISA + "': export the model again here");
#endif
#ifdef KILN_VERSION
    if (metadata_["kiln_version"].text != KILN_VERSION)
      throw std::runtime_error("kiln: " + dir + " was built for kiln version '" + metadata_["kiln_version"].text +
                               "'; this runner has '" + KILN_VERSION + "'");
#endif
    // The files are what the export wrote: a corrupted or replaced file is refused here rather
    // than run (its digest is metadata.json's).
    auto weights_file = map_file(dir + "/weights.safetensors");
    check_digest(dir, "weights.safetensors", *weights_file);
    check_digest(dir, "model.so", *map_file(dir + "/model.so"));
    for (const auto& [name, t] : load_safetensors(dir + "/weights.safetensors", weights_file)) {
      std::vector<int64_t> stride;
      for (const auto& s : metadata_["weights"][name]["stride"].items) stride.push_back(s.integer());
      // In the layout it was exported in: the mapped tensor itself where that is the stored one.
      weights_[name] = t.strides() == c10::IntArrayRef(stride) ? t : at::empty_strided(t.sizes(), stride, t.options()).copy_(t);
    }
    library_ = dlopen((dir + "/model.so").c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!library_) throw std::runtime_error(std::string("kiln: cannot load ") + dir + "/model.so: " + dlerror());
    entry_ = reinterpret_cast<int (*)(void**, void**)>(dlsym(library_, metadata_["entry"].text.c_str()));
    error_ = reinterpret_cast<const char* (*)()>(dlsym(library_, "kiln_error"));
    if (!entry_ || !error_) throw std::runtime_error("kiln: " + dir + "/model.so lacks its entry points");
  }

  const Json& metadata() const { return metadata_; }

  void check_digest(const std::string& dir, const std::string& name, const MappedFile& file) const {
    if (!metadata_.has("digests") || !metadata_["digests"].has(name)) return;
    if (sha256_hex(file) != metadata_["digests"][name].text)
      throw std::runtime_error("kiln: " + dir + "/" + name + " does not match its digest in metadata.json "
                               "(the file is corrupted or was replaced): export the model again");
  }

  // "ids: int64[batch, 16], mask: int64[batch, 16] (batch in [2, 64])"
  std::string signature() const {
    std::string out;
    for (const auto& i : metadata_["inputs"].items) {
      out += (out.empty() ? "" : ", ") + i["name"].text + ": " + i["dtype"].text + "[";
      for (size_t d = 0; d < i["shape"].items.size(); ++d) {
        const Json& size = i["shape"].items[d];
        out += (d ? ", " : "") + (size.kind == Json::String ? size.text : std::to_string(size.integer()));
      }
      out += "]";
    }
    std::string ranges;
    if (metadata_.has("symbols"))
      for (const auto& [name, range] : metadata_["symbols"].fields)
        ranges += (ranges.empty() ? "" : ", ") + name + " in [" + std::to_string(range["min"].integer()) + ", " +
                  (range["max"].kind == Json::Null ? std::string("inf") : std::to_string(range["max"].integer())) + "]";
    return ranges.empty() ? out : out + " (" + ranges + ")";
  }

  std::vector<at::Tensor> run(const std::map<std::string, at::Tensor>& named) {
    std::vector<at::Tensor> inputs;
    std::map<std::string, int64_t> sizes;  // each symbol's size in this call
    for (const auto& spec : metadata_["inputs"].items) {
      auto found = named.find(spec["name"].text);
      if (found == named.end()) throw std::runtime_error("kiln: missing input '" + spec["name"].text + "'; the artifact takes " + signature());
      const at::Tensor& t = found->second;
      if (t.scalar_type() != dtype_of(spec["dtype"].text) || !fits(t, spec["shape"], sizes))
        throw std::runtime_error("kiln: input '" + spec["name"].text + "' has the wrong dtype or shape; the artifact takes " + signature());
      inputs.push_back(t);
    }
    if (named.size() != inputs.size()) throw std::runtime_error("kiln: unexpected inputs; the artifact takes " + signature());
    std::vector<void*> handles;
    for (const auto& step : metadata_["graph_inputs"].items) {
      at::Tensor t = step.has("input") ? inputs.at(step["input"].integer()) : weights_.at(step["weight"].text);
      handles.push_back(new at::Tensor(t));  // owned by the graph, which releases it
    }
    std::vector<void*> outputs(metadata_["graph_outputs"].integer(), nullptr);
    int status = entry_(handles.data(), outputs.data());
    if (status) throw std::runtime_error(std::string("kiln: ") + error_());
    std::vector<at::Tensor> graph_outputs;
    for (void* h : outputs) {
      graph_outputs.push_back(*static_cast<at::Tensor*>(h));
      delete static_cast<at::Tensor*>(h);
    }
    std::vector<at::Tensor> result;
    for (const auto& o : metadata_["outputs"].items) result.push_back(graph_outputs.at(o["graph_output"].integer()));
    return result;
  }

 private:
  // Whether t's shape is `shape`: its numbers exactly, each symbol within its range and the same
  // size wherever it appears in the call.
  bool fits(const at::Tensor& t, const Json& shape, std::map<std::string, int64_t>& sizes) const {
    if (t.dim() != static_cast<int64_t>(shape.items.size())) return false;
    for (int64_t d = 0; d < t.dim(); ++d) {
      const Json& want = shape.items[d];
      if (want.kind != Json::String) {
        if (t.size(d) != want.integer()) return false;
        continue;
      }
      const Json& range = metadata_["symbols"][want.text];
      auto [seen, fresh] = sizes.emplace(want.text, t.size(d));
      if (seen->second != t.size(d) || t.size(d) < range["min"].integer() ||
          (range["max"].kind != Json::Null && t.size(d) > range["max"].integer()))
        return false;
    }
    return true;
  }

  std::string dir_;
  Json metadata_;
  std::map<std::string, at::Tensor> weights_;
  void* library_ = nullptr;
  int (*entry_)(void**, void**) = nullptr;
  const char* (*error_)() = nullptr;
};

}  // namespace kiln
