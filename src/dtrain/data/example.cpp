// tf.train.Example, TensorProto and raw bytes, over protobuf's wire format: a message is
// fields, each a varint tag (field number << 3 | wire type) then a varint (type 0), 8 bytes
// (1), a varint length and that many bytes (2: strings, messages, packed lists) or 4 bytes
// (5). Every length is checked against the bytes left before anything is read for it.
#include "dtrain/data/example.h"

#include <algorithm>
#include <climits>
#include <cstring>
#include <limits>
#include <unordered_map>

#include "dtrain/core/error.h"

namespace dtrain::data {
namespace {

// ---- reading

// A message's bytes being read; errors name the message and the byte, counted from the
// start of the outermost message.
struct WireReader {
  const char* message;
  const unsigned char* base;  // the outermost message's first byte
  const unsigned char* p;
  const unsigned char* end;

  WireReader(const char* what, std::string_view bytes)
      : message(what),
        base(reinterpret_cast<const unsigned char*>(bytes.data())),
        p(base),
        end(base + bytes.size()) {}
  WireReader(const WireReader& outer, std::string_view inner)
      : message(outer.message),
        base(outer.base),
        p(reinterpret_cast<const unsigned char*>(inner.data())),
        end(p + inner.size()) {}

  [[noreturn]] void fail(const std::string& what) const {
    DTRAIN_THROW(InvalidArgument, message, ": not a valid message: ", what, " at byte ", p - base);
  }
  bool done() const { return p >= end; }
  std::uint64_t varint() {
    std::uint64_t v = 0;
    for (int shift = 0; shift < 70; shift += 7) {
      if (p >= end) fail("a varint runs past the end");
      const unsigned char b = *p++;
      v |= static_cast<std::uint64_t>(b & 0x7fu) << shift;
      if (!(b & 0x80u)) return v;
    }
    fail("a varint longer than 10 bytes");
  }
  std::uint32_t fixed32() {
    if (end - p < 4) fail("a 4-byte value runs past the end");
    std::uint32_t v;
    std::memcpy(&v, p, 4);
    p += 4;
    return v;
  }
  void skip_fixed(std::size_t n) {
    if (static_cast<std::size_t>(end - p) < n) fail("a " + std::to_string(n) + "-byte value runs past the end");
    p += n;
  }
  std::string_view bytes() {
    const std::uint64_t n = varint();
    if (n > static_cast<std::uint64_t>(end - p))
      fail("a length of " + std::to_string(n) + " bytes where " + std::to_string(end - p) + " are left");
    const std::string_view v(reinterpret_cast<const char*>(p), static_cast<std::size_t>(n));
    p += n;
    return v;
  }
  struct Tag {
    std::uint64_t field;
    int type;
  };
  Tag tag() {
    const std::uint64_t v = varint();
    const Tag t{v >> 3, static_cast<int>(v & 7u)};
    if (t.field == 0) fail("field number 0");
    return t;
  }
  void skip(int type) {
    switch (type) {
      case 0: varint(); return;
      case 1: skip_fixed(8); return;
      case 2: bytes(); return;
      case 5: skip_fixed(4); return;
      default: fail("wire type " + std::to_string(type) + " (groups and unknown types are not read)");
    }
  }
  // A field that must have `want` wire type.
  void expect(const Tag& t, int want, const char* field) {
    if (t.type != want)
      fail(std::string(field) + " has wire type " + std::to_string(t.type) + ", not " + std::to_string(want));
  }
};

// One occurrence of a repeated float field (packed: many; wire type 5: one), or of a
// repeated varint field (packed, or wire type 0), each value given to add(). FloatList's
// and Int64List's field 1 and TensorProto's value lists read alike.
template <typename Add>
void read_floats(WireReader& r, const WireReader::Tag& t, const char* what, Add&& add) {
  if (t.type == 2) {
    const std::string_view packed = r.bytes();
    if (packed.size() % 4 != 0) r.fail(std::string("a packed ") + what + " of " + std::to_string(packed.size()) + " bytes");
    for (std::size_t i = 0; i < packed.size(); i += 4) {
      float f;
      std::memcpy(&f, packed.data() + i, 4);
      add(f);
    }
    return;
  }
  r.expect(t, 5, what);
  const std::uint32_t bits = r.fixed32();
  float f;
  std::memcpy(&f, &bits, 4);
  add(f);
}

template <typename Add>
void read_varints(WireReader& r, const WireReader::Tag& t, const char* what, Add&& add) {
  if (t.type == 2) {
    WireReader packed(r, r.bytes());
    while (!packed.done()) add(static_cast<std::int64_t>(packed.varint()));
    return;
  }
  r.expect(t, 0, what);
  add(static_cast<std::int64_t>(r.varint()));
}

// The values of a FloatList, Int64List or BytesList message (field 1, packed or not).
template <typename Add>
void each_float(WireReader list, Add&& add) {
  while (!list.done()) {
    const auto t = list.tag();
    if (t.field == 1) read_floats(list, t, "float list", add);
    else list.skip(t.type);
  }
}

template <typename Add>
void each_int64(WireReader list, Add&& add) {
  while (!list.done()) {
    const auto t = list.tag();
    if (t.field == 1) read_varints(list, t, "int64 list", add);
    else list.skip(t.type);
  }
}

template <typename Add>
void each_bytes(WireReader list, Add&& add) {
  while (!list.done()) {
    const auto t = list.tag();
    if (t.field != 1) {
      list.skip(t.type);
      continue;
    }
    list.expect(t, 2, "a bytes value");
    add(list.bytes());
  }
}

// A Feature message: which list it holds (the last one set) and that list's bytes.
struct FeatureView {
  Feature::Kind kind = Feature::Kind::none;
  std::string_view list;
};

FeatureView view_feature(WireReader feature) {
  FeatureView v;
  while (!feature.done()) {
    const auto t = feature.tag();
    if (t.field < 1 || t.field > 3) {
      feature.skip(t.type);
      continue;
    }
    feature.expect(t, 2, "a Feature's list");
    v.kind = static_cast<Feature::Kind>(t.field);  // 1 bytes, 2 floats, 3 int64s: the enum's order
    v.list = feature.bytes();
  }
  return v;
}

// Calls fn(key, feature's reader) for each entry of the Example's feature map, in order.
template <typename Fn>
void each_feature(WireReader& example, Fn&& fn) {
  while (!example.done()) {
    const auto t = example.tag();
    if (t.field != 1) {
      example.skip(t.type);
      continue;
    }
    example.expect(t, 2, "Example.features");
    WireReader features(example, example.bytes());
    while (!features.done()) {
      const auto f = features.tag();
      if (f.field != 1) {
        features.skip(f.type);
        continue;
      }
      features.expect(f, 2, "a Features entry");
      WireReader entry(features, features.bytes());
      std::string_view key, value;
      while (!entry.done()) {
        const auto e = entry.tag();
        if (e.field == 1) {
          entry.expect(e, 2, "a feature's key");
          key = entry.bytes();
        } else if (e.field == 2) {
          entry.expect(e, 2, "a feature's value");
          value = entry.bytes();
        } else {
          entry.skip(e.type);
        }
      }
      fn(key, WireReader(entry, value));
    }
  }
}

const char* kind_name(Feature::Kind k) {
  switch (k) {
    case Feature::Kind::none: return "an empty Feature";
    case Feature::Kind::bytes: return "a bytes_list";
    case Feature::Kind::floats: return "a float_list";
    case Feature::Kind::int64s: return "an int64_list";
  }
  return "?";
}

Feature::Kind kind_for(DType t) {
  switch (t) {
    case DType::f32: return Feature::Kind::floats;
    case DType::i32: return Feature::Kind::int64s;
    case DType::string: return Feature::Kind::bytes;
    default: return Feature::Kind::none;
  }
}

// The name TensorFlow gives a spec's dtype (int64 for what dtrain holds as int32).
std::string_view spec_type_name(DType t) { return t == DType::i32 ? "int64" : dtype_name(t); }

// ---- writing

void put_varint(std::string& out, std::uint64_t v) {
  while (v >= 0x80u) {
    out.push_back(static_cast<char>(v | 0x80u));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}
void put_tag(std::string& out, std::uint64_t field, int type) { put_varint(out, field << 3 | static_cast<unsigned>(type)); }
void put_bytes(std::string& out, std::uint64_t field, std::string_view bytes) {
  put_tag(out, field, 2);
  put_varint(out, bytes.size());
  out.append(bytes);
}

// `what()` names the value for the message; it is built only when the value does not fit.
template <typename What>
std::int32_t narrow_int(std::int64_t v, const What& what) {
  if (v < INT32_MIN || v > INT32_MAX)
    DTRAIN_THROW(InvalidArgument, what(), ": the value ", v, " is beyond int32, which dtrain holds int64 values in");
  return static_cast<std::int32_t>(v);
}

// ---- parse_examples

// One spec's values over the examples: concatenated, with each example's start.
struct Column {
  std::vector<float> floats;
  std::vector<std::int32_t> ints;
  std::vector<std::string> strings;
  std::vector<std::int64_t> starts{0};
  std::int64_t size(DType t) const {
    return static_cast<std::int64_t>(t == DType::f32 ? floats.size() : t == DType::i32 ? ints.size() : strings.size());
  }
};

// `where()` names the example and feature in messages (built only for one).
template <typename Where>
void append_values(Column& c, const FeatureSpec& spec, const FeatureView& v, const Where& where) {
  if (v.kind == Feature::Kind::none) return;  // no values, whatever the type
  if (v.kind != kind_for(spec.dtype))
    DTRAIN_THROW(InvalidArgument, where(), ": the Example holds ", kind_name(v.kind), " where the spec asks for ",
                 spec_type_name(spec.dtype), " (", kind_name(kind_for(spec.dtype)), ")");
  WireReader list("Example", v.list);
  switch (spec.dtype) {
    case DType::f32: each_float(list, [&](float f) { c.floats.push_back(f); }); break;
    case DType::i32: each_int64(list, [&](std::int64_t i) { c.ints.push_back(narrow_int(i, where)); }); break;
    default: each_bytes(list, [&](std::string_view s) { c.strings.emplace_back(s); }); break;
  }
}

void append_default(Column& c, const FeatureSpec& spec, std::int64_t count) {
  const Tensor& d = *spec.default_value;
  for (std::int64_t i = 0; i < count; ++i) {
    const std::int64_t j = d.numel() == 1 ? 0 : i;
    switch (spec.dtype) {
      case DType::f32: c.floats.push_back(d.data<float>()[j]); break;
      case DType::i32: c.ints.push_back(d.data<std::int32_t>()[j]); break;
      default: c.strings.push_back(d.data<std::string>()[j]); break;
    }
  }
}

// rows x `per_row` values of column `c` (row r from c.starts[r], c.starts[r+1] - c.starts[r]
// of them, the rest padding) into a new tensor of `shape`.
Tensor gather_padded(const Column& c, const FeatureSpec& spec, const Shape& shape, std::int64_t per_row) {
  Tensor out = Tensor::empty(shape, spec.dtype);
  const std::int64_t rows = static_cast<std::int64_t>(c.starts.size()) - 1;
  const Tensor* pad = spec.default_value ? &*spec.default_value : nullptr;
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::int64_t from = c.starts[r], n = c.starts[r + 1] - from;
    for (std::int64_t i = 0; i < per_row; ++i) {
      const std::int64_t at = r * per_row + i;
      const bool have = i < n;
      switch (spec.dtype) {
        case DType::f32: out.data<float>()[at] = have ? c.floats[from + i] : pad ? pad->data<float>()[0] : 0.0f; break;
        case DType::i32: out.data<std::int32_t>()[at] = have ? c.ints[from + i] : pad ? pad->data<std::int32_t>()[0] : 0; break;
        default: out.data<std::string>()[at] = have ? c.strings[from + i] : pad ? pad->data<std::string>()[0] : std::string(); break;
      }
    }
  }
  return out;
}

void check_spec(const FeatureSpec& spec, const char* fn) {
  if (spec.dtype != DType::f32 && spec.dtype != DType::i32 && spec.dtype != DType::string)
    DTRAIN_THROW(InvalidArgument, fn, ": feature '", spec.key, "': dtype ", dtype_name(spec.dtype),
                 " is not one an Example holds (float32, int64 or string)");
  if (!spec.default_value) return;
  const Tensor& d = *spec.default_value;
  if (d.dtype() != spec.dtype)
    DTRAIN_THROW(InvalidArgument, fn, ": feature '", spec.key, "': its default_value is ", dtype_name(d.dtype()),
                 ", its dtype ", spec_type_name(spec.dtype));
  const std::int64_t want = spec.kind == FeatureSpec::Kind::fixed_len ? spec.shape.numel() : 1;
  if (d.numel() != want && d.numel() != 1)
    DTRAIN_THROW(InvalidArgument, fn, ": feature '", spec.key, "': its default_value has ", d.numel(),
                 " values where its shape ", spec.shape.to_string(), " holds ", want);
}

}  // namespace

std::string serialize_example(const Features& features) {
  std::string map;
  for (const auto& [key, feature] : features) {
    std::string list;
    switch (feature.kind) {
      case Feature::Kind::none: break;
      case Feature::Kind::bytes:
        for (const std::string& b : feature.bytes) put_bytes(list, 1, b);
        break;
      case Feature::Kind::floats:
        if (!feature.floats.empty())
          put_bytes(list, 1, std::string_view(reinterpret_cast<const char*>(feature.floats.data()), feature.floats.size() * 4));
        break;
      case Feature::Kind::int64s: {
        std::string packed;
        for (std::int64_t v : feature.int64s) put_varint(packed, static_cast<std::uint64_t>(v));
        if (!packed.empty()) put_bytes(list, 1, packed);
        break;
      }
    }
    std::string value;
    if (feature.kind != Feature::Kind::none) put_bytes(value, static_cast<std::uint64_t>(feature.kind), list);
    std::string entry;
    put_bytes(entry, 1, key);
    put_bytes(entry, 2, value);
    put_bytes(map, 1, entry);
  }
  std::string out;
  put_bytes(out, 1, map);
  return out;
}

Features parse_example_message(std::string_view bytes) {
  Features out;
  WireReader example("Example", bytes);
  each_feature(example, [&](std::string_view key, WireReader value) {
    const FeatureView v = view_feature(value);
    Feature f;
    f.kind = v.kind;
    WireReader list(value, v.list);
    switch (v.kind) {
      case Feature::Kind::none: break;
      case Feature::Kind::bytes: each_bytes(list, [&](std::string_view s) { f.bytes.emplace_back(s); }); break;
      case Feature::Kind::floats: each_float(list, [&](float x) { f.floats.push_back(x); }); break;
      case Feature::Kind::int64s: each_int64(list, [&](std::int64_t x) { f.int64s.push_back(x); }); break;
    }
    out[std::string(key)] = std::move(f);
  });
  return out;
}

std::vector<ParsedFeature> parse_examples(const Tensor& serialized, const std::vector<FeatureSpec>& specs) {
  const bool single = serialized.rank() == 0;
  const char* fn = single ? "parse_single_example" : "parse_example";
  serialized.check_defined(fn);
  if (serialized.dtype() != DType::string || serialized.rank() > 1)
    DTRAIN_THROW(InvalidArgument, fn, ": serialized must be ", single ? "a string scalar" : "a string vector", ", got ",
                 dtype_name(serialized.dtype()), " ", serialized.shape().to_string());
  std::unordered_map<std::string_view, std::size_t> index;
  for (std::size_t s = 0; s < specs.size(); ++s) {
    check_spec(specs[s], fn);
    if (!index.emplace(specs[s].key, s).second)
      DTRAIN_THROW(InvalidArgument, fn, ": feature '", specs[s].key, "' is in the spec twice");
  }
  const std::int64_t count = serialized.numel();
  std::vector<Column> columns(specs.size());
  std::vector<std::optional<FeatureView>> found(specs.size());  // unset: the Example lacks it
  for (std::int64_t e = 0; e < count; ++e) {
    const std::string& bytes = serialized.data<std::string>()[e];
    // Message context, built only for a message.
    const auto example_name = [&] { return single ? std::string(fn) : std::string(fn) + ": example " + std::to_string(e); };
    std::fill(found.begin(), found.end(), std::nullopt);
    try {
      WireReader example("Example", bytes);
      each_feature(example, [&](std::string_view key, WireReader value) {
        const auto it = index.find(key);
        if (it != index.end()) found[it->second] = view_feature(value);
      });
    } catch (const InvalidArgument& err) {
      DTRAIN_THROW(InvalidArgument, example_name(), ": ", err.what());
    }
    for (std::size_t s = 0; s < specs.size(); ++s) {
      const FeatureSpec& spec = specs[s];
      Column& c = columns[s];
      const auto where = [&] { return example_name() + ": feature '" + spec.key + "'"; };
      const bool present = found[s].has_value();
      const std::int64_t before = c.size(spec.dtype);
      if (present) {
        try {
          append_values(c, spec, *found[s], where);
        } catch (const InvalidArgument& err) {
          if (std::string_view(err.what()).starts_with(where())) throw;
          DTRAIN_THROW(InvalidArgument, where(), ": ", err.what());
        }
      }
      const std::int64_t got = c.size(spec.dtype) - before;
      const std::int64_t item = spec.shape.numel();
      switch (spec.kind) {
        case FeatureSpec::Kind::fixed_len:
          if (!present) {
            if (!spec.default_value)
              DTRAIN_THROW(InvalidArgument, where(), " (", spec_type_name(spec.dtype),
                           ") is required but the Example has none (give the spec a default_value to fill it)");
            append_default(c, spec, item);
          } else if (got != item) {
            DTRAIN_THROW(InvalidArgument, where(), " has ", got, " values where its shape ", spec.shape.to_string(),
                         " holds ", item);
          }
          break;
        case FeatureSpec::Kind::fixed_len_sequence:
          if (!present && !spec.allow_missing)
            DTRAIN_THROW(InvalidArgument, where(), " (", spec_type_name(spec.dtype),
                         ") is required but the Example has none (allow_missing=True reads it as empty)");
          if (item == 0 ? got != 0 : got % item != 0)
            DTRAIN_THROW(InvalidArgument, where(), " has ", got, " values, not a whole number of items of shape ",
                         spec.shape.to_string());
          break;
        case FeatureSpec::Kind::var_len: break;
      }
      c.starts.push_back(c.size(spec.dtype));
    }
  }
  std::vector<ParsedFeature> out(specs.size());
  for (std::size_t s = 0; s < specs.size(); ++s) {
    const FeatureSpec& spec = specs[s];
    const Column& c = columns[s];
    const std::int64_t item = spec.shape.numel();
    std::int64_t longest = 0;
    for (std::int64_t e = 0; e < count; ++e) longest = std::max(longest, c.starts[e + 1] - c.starts[e]);
    std::vector<std::int64_t> dims;
    if (!single) dims.push_back(count);
    switch (spec.kind) {
      case FeatureSpec::Kind::fixed_len:
        for (std::int64_t d : spec.shape.dims()) dims.push_back(d);
        out[s].values = gather_padded(c, spec, Shape(dims), item);
        break;
      case FeatureSpec::Kind::fixed_len_sequence: {
        const std::int64_t items = item == 0 ? 0 : longest / item;
        dims.push_back(items);
        for (std::int64_t d : spec.shape.dims()) dims.push_back(d);
        out[s].values = gather_padded(c, spec, Shape(dims), items * item);
        break;
      }
      case FeatureSpec::Kind::var_len: {
        const std::int64_t total = c.size(spec.dtype);
        FeatureSpec plain = spec;
        plain.default_value.reset();
        Column whole = c;
        whole.starts = {0, total};
        out[s].values = gather_padded(whole, plain, Shape{total}, total);
        const std::int64_t rank = single ? 1 : 2;
        out[s].indices = Tensor::empty({total, rank}, DType::i32);
        auto* idx = out[s].indices.data<std::int32_t>();
        for (std::int64_t e = 0; e < count; ++e)
          for (std::int64_t j = c.starts[e]; j < c.starts[e + 1]; ++j) {
            if (!single) *idx++ = static_cast<std::int32_t>(e);
            *idx++ = static_cast<std::int32_t>(j - c.starts[e]);
          }
        std::vector<std::int32_t> shape;
        if (!single) shape.push_back(static_cast<std::int32_t>(count));
        shape.push_back(static_cast<std::int32_t>(longest));
        out[s].dense_shape = Tensor::from_vector(Shape{rank}, std::span<const std::int32_t>(shape));
        break;
      }
    }
  }
  return out;
}

// ---- TensorProto

namespace {

// TensorFlow's DataType numbers for the types dtrain holds.
int tf_type_of(DType t) {
  switch (t) {
    case DType::f32: return 1;
    case DType::i32: return 3;
    case DType::u8: return 4;
    case DType::string: return 7;
    case DType::bf16: return 14;
    case DType::f16: return 19;
  }
  return 0;
}

std::string tf_type_name(std::uint64_t t) {
  static const std::map<std::uint64_t, const char*> names{
      {1, "float32"}, {2, "float64"}, {3, "int32"},  {4, "uint8"},   {5, "int16"},  {6, "int8"},
      {7, "string"},  {8, "complex64"}, {9, "int64"}, {10, "bool"}, {14, "bfloat16"}, {17, "uint16"},
      {18, "complex128"}, {19, "float16"}, {22, "uint32"}, {23, "uint64"}};
  const auto it = names.find(t);
  return it == names.end() ? "DataType " + std::to_string(t) : it->second;
}

}  // namespace

std::string serialize_tensor(const Tensor& t) {
  t.check_defined("serialize_tensor");
  const Tensor host = t.on_cpu() ? t : t.to(Device{});
  std::string out;
  put_tag(out, 1, 0);
  put_varint(out, static_cast<std::uint64_t>(tf_type_of(host.dtype())));
  std::string shape;
  for (std::int64_t d : host.shape().dims()) {
    std::string dim;
    if (d != 0) {
      put_tag(dim, 1, 0);
      put_varint(dim, static_cast<std::uint64_t>(d));
    }
    put_bytes(shape, 2, dim);
  }
  put_bytes(out, 2, shape);
  if (host.dtype() == DType::string) {
    for (std::int64_t i = 0; i < host.numel(); ++i) put_bytes(out, 8, host.data<std::string>()[i]);
  } else if (host.numel() > 0) {
    put_bytes(out, 4, std::string_view(static_cast<const char*>(host.raw_data()),
                                       static_cast<std::size_t>(host.numel()) * dtype_size(host.dtype())));
  }
  return out;
}

Tensor parse_tensor(std::string_view bytes, DType out_type) {
  WireReader r("TensorProto", bytes);
  std::uint64_t type = 0;
  std::vector<std::int64_t> dims;
  std::string_view content;
  bool has_content = false;
  std::vector<float> floats;
  std::vector<std::int64_t> ints;  // int_val, int64_val, bool_val, half_val
  std::vector<std::string_view> strings;
  while (!r.done()) {
    const auto t = r.tag();
    switch (t.field) {
      case 1: r.expect(t, 0, "dtype"); type = r.varint(); break;
      case 2: {
        r.expect(t, 2, "tensor_shape");
        WireReader shape(r, r.bytes());
        dims.clear();
        while (!shape.done()) {
          const auto s = shape.tag();
          if (s.field == 3) {
            shape.expect(s, 0, "unknown_rank");
            if (shape.varint() != 0) shape.fail("a shape of unknown rank");
          } else if (s.field == 2) {
            shape.expect(s, 2, "a dim");
            WireReader dim(shape, shape.bytes());
            std::int64_t size = 0;
            while (!dim.done()) {
              const auto d = dim.tag();
              if (d.field == 1) {
                dim.expect(d, 0, "a dim's size");
                size = static_cast<std::int64_t>(dim.varint());
              } else {
                dim.skip(d.type);
              }
            }
            if (size < 0) shape.fail("a dim of unknown size " + std::to_string(size));
            dims.push_back(size);
          } else {
            shape.skip(s.type);
          }
        }
        break;
      }
      case 4: r.expect(t, 2, "tensor_content"); content = r.bytes(); has_content = true; break;
      case 5: read_floats(r, t, "float_val", [&](float f) { floats.push_back(f); }); break;
      case 7: case 10: case 11: case 13:  // int_val, int64_val, bool_val, half_val
        read_varints(r, t, "integer value list", [&](std::int64_t v) { ints.push_back(v); });
        break;
      case 8: r.expect(t, 2, "string_val"); strings.push_back(r.bytes()); break;
      default: r.skip(t.type);
    }
  }
  const bool int64_for_int32 = out_type == DType::i32 && type == 9;
  if (type != static_cast<std::uint64_t>(tf_type_of(out_type)) && !int64_for_int32)
    DTRAIN_THROW(InvalidArgument, "parse_tensor: the serialized tensor is ", tf_type_name(type), ", out_type ",
                 dtype_name(out_type));
  std::int64_t n = 1;
  for (std::int64_t d : dims) {
    if (d != 0 && n > std::numeric_limits<std::int64_t>::max() / d / 16)
      DTRAIN_THROW(InvalidArgument, "parse_tensor: a shape of more elements than memory holds");
    n *= d;
  }
  const std::size_t width = int64_for_int32 ? 8 : dtype_size(out_type);
  const std::size_t values = out_type == DType::string ? strings.size()
                             : has_content              ? content.size() / width
                             : out_type == DType::f32   ? floats.size()
                                                        : ints.size();
  if (has_content && out_type != DType::string && content.size() != static_cast<std::size_t>(n) * width)
    DTRAIN_THROW(InvalidArgument, "parse_tensor: tensor_content holds ", content.size(), " bytes where shape ",
                 Shape(dims).to_string(), " of ", tf_type_name(type), " needs ", static_cast<std::size_t>(n) * width);
  if (!has_content && values != static_cast<std::size_t>(n) && values > 1)
    DTRAIN_THROW(InvalidArgument, "parse_tensor: ", values, " values where shape ", Shape(dims).to_string(), " holds ", n);
  if (out_type == DType::string && values == 0 && n > 0)
    DTRAIN_THROW(InvalidArgument, "parse_tensor: no string values where shape ", Shape(dims).to_string(), " holds ", n);
  // A value given once (or none, zeros) for the whole shape is expanded: within bounds, as
  // the shape comes from the bytes.
  const std::size_t each = dtype_size(out_type) + (out_type == DType::string && values == 1 ? strings[0].size() : 0);
  if (!has_content && values <= 1 && static_cast<std::size_t>(n) > (std::size_t{16} << 20) / each)
    DTRAIN_THROW(InvalidArgument, "parse_tensor: a value given once for the ", n, " elements of shape ",
                 Shape(dims).to_string(), ": more than dtrain expands (16 MiB)");
  Tensor out = Tensor::empty(Shape(dims), out_type);
  for (std::int64_t i = 0; i < n; ++i) {
    const std::size_t j = values == 1 ? 0 : static_cast<std::size_t>(i);
    const auto element = [i] { return "parse_tensor: element " + std::to_string(i); };
    switch (out_type) {
      case DType::string: out.data<std::string>()[i] = std::string(strings[j]); break;
      case DType::f32:
        if (has_content) std::memcpy(out.data<float>() + i, content.data() + 4 * i, 4);
        else out.data<float>()[i] = values == 0 ? 0.0f : floats[j];
        break;
      case DType::i32:
        if (has_content && int64_for_int32) {
          std::int64_t v;
          std::memcpy(&v, content.data() + 8 * i, 8);
          out.data<std::int32_t>()[i] = narrow_int(v, element);
        } else if (has_content) {
          std::memcpy(out.data<std::int32_t>() + i, content.data() + 4 * i, 4);
        } else {
          const std::int64_t v = values == 0 ? 0 : ints[j];
          out.data<std::int32_t>()[i] = int64_for_int32 ? narrow_int(v, element) : static_cast<std::int32_t>(v);
        }
        break;
      case DType::u8:
        out.data<std::uint8_t>()[i] = has_content ? static_cast<std::uint8_t>(content[i])
                                                  : static_cast<std::uint8_t>(values == 0 ? 0 : ints[j]);
        break;
      case DType::bf16:
      case DType::f16: {  // 16-bit patterns: TensorFlow's half_val holds them as ints
        std::uint16_t bits;
        if (has_content) std::memcpy(&bits, content.data() + 2 * i, 2);
        else bits = static_cast<std::uint16_t>(values == 0 ? 0 : ints[j]);
        static_cast<std::uint16_t*>(out.raw_data())[i] = bits;
        break;
      }
    }
  }
  return out;
}

Tensor decode_raw(const Tensor& bytes, DType out_type, bool little_endian) {
  bytes.check_defined("decode_raw");
  if (bytes.dtype() != DType::string)
    DTRAIN_THROW(InvalidArgument, "decode_raw: input_bytes must be strings, got ", dtype_name(bytes.dtype()));
  if (out_type == DType::string) DTRAIN_THROW(InvalidArgument, "decode_raw: out_type must be a number type, got string");
  const std::size_t width = dtype_size(out_type);
  const std::int64_t count = bytes.numel();
  const std::string* in = bytes.data<std::string>();
  const std::size_t length = count > 0 ? in[0].size() : 0;
  for (std::int64_t i = 0; i < count; ++i)
    if (in[i].size() != length)
      DTRAIN_THROW(InvalidArgument, "decode_raw: every string must have the same length, but element ", i, " has ",
                   in[i].size(), " bytes and element 0 ", length);
  if (length % width != 0)
    DTRAIN_THROW(InvalidArgument, "decode_raw: ", length, " bytes are not a whole number of ", dtype_name(out_type),
                 " values (", width, " bytes each)");
  std::vector<std::int64_t> dims(bytes.shape().dims().begin(), bytes.shape().dims().end());
  const auto per = static_cast<std::int64_t>(length / width);
  dims.push_back(per);
  Tensor out = Tensor::empty(Shape(dims), out_type);
  auto* to = static_cast<char*>(out.raw_data());
  for (std::int64_t i = 0; i < count; ++i) {
    if (length > 0) std::memcpy(to + i * static_cast<std::int64_t>(length), in[i].data(), length);
    if (!little_endian && width > 1)
      for (std::int64_t v = 0; v < per; ++v) {
        char* e = to + i * static_cast<std::int64_t>(length) + v * static_cast<std::int64_t>(width);
        std::reverse(e, e + width);
      }
  }
  return out;
}

}  // namespace dtrain::data
