// tf.data: the Dataset pipeline, run by dtrain's C++ threads. Python functions given to
// from_generator, map and filter run there too, each call taking the GIL.
#include <pybind11/stl.h>

#include "bindings.h"
#include "dtrain/data/example.h"

namespace dtrain::python {
namespace {

// One component per tensor: a tuple or list is several, anything else one. `dtypes`
// (one per component, "" for any) converts them.
data::Element element_of(py::handle value, const std::vector<std::string>& dtypes, const char* what) {
  data::Element out;
  if (py::isinstance<py::tuple>(value) || py::isinstance<py::list>(value)) {
    std::size_t i = 0;
    for (py::handle part : value) {
      out.push_back(to_tensor(part, what, i < dtypes.size() ? dtypes[i] : ""));
      ++i;
    }
  } else {
    out.push_back(to_tensor(value, what, dtypes.empty() ? "" : dtypes[0]));
  }
  if (!dtypes.empty() && out.size() != dtypes.size())
    throw py::value_error(std::string(what) + ": an element of " + std::to_string(out.size()) +
                          " component(s) where the signature has " + std::to_string(dtypes.size()));
  return out;
}

py::list components(const data::Element& e) {
  py::list out;
  for (const Tensor& t : e) out.append(py::cast(t));
  return out;
}

// Calls fn with an element's components as positional arguments.
py::object call_with(const py::object& fn, const data::Element& e) {
  py::tuple args(e.size());
  for (std::size_t i = 0; i < e.size(); ++i) args[i] = py::cast(e[i]);
  return fn(*args);
}


}  // namespace

py::list next_components(data::Iterator& it) {
  std::optional<data::Element> e;
  {
    py::gil_scoped_release release;
    e = it.next();
  }
  if (!e) throw py::stop_iteration();
  return components(*e);
}

py::list PyIterator::next() { return next_components(*it_); }

void bind_data(py::module_& m) {
  py::module_ d = m.def_submodule("data", "tf.data's Dataset over dtrain's pipeline");
  d.attr("AUTOTUNE") = data::AUTOTUNE;
  d.attr("INFINITE_CARDINALITY") = data::kInfiniteCardinality;
  d.attr("UNKNOWN_CARDINALITY") = data::kUnknownCardinality;

  py::enum_<data::AutoShardPolicy>(d, "AutoShardPolicy")
      .value("AUTO", data::AutoShardPolicy::AUTO)
      .value("FILE", data::AutoShardPolicy::FILE)
      .value("DATA", data::AutoShardPolicy::DATA)
      .value("OFF", data::AutoShardPolicy::OFF);

  py::class_<PyIterator>(d, "_Iterator").def("next", &PyIterator::next);

  // tf.io.TFRecordWriter's engine: TensorFlow's framing of records.
  py::class_<data::RecordWriter>(d, "_TFRecordWriter")
      .def(py::init([](const std::string& path, const std::string& compression, int level) {
        return std::make_unique<data::RecordWriter>(
            path, data::RecordFraming::tfrecord, data::compression_named(compression, "TFRecordWriter"), level);
      }))
      .def("write", [](data::RecordWriter& w, const py::bytes& record) { w.write(std::string(record)); })
      .def("flush", &data::RecordWriter::flush)
      .def("close", &data::RecordWriter::close);
  d.def("crc32c", [](const py::bytes& b) { return data::crc32c(std::string(b)); });
  // tf.train.Example, tf.io's parsing and tensors as bytes (python/dtrain/io.py, train.py).
  // A feature crosses as (key, kind, values): kind 0 none, 1 bytes (a list of bytes), 2
  // floats (a float32 array), 3 int64s (an int64 array).
  d.def("serialize_example", [](const py::list& features) {
    data::Features f;
    for (py::handle item : features) {
      const auto entry = item.cast<py::tuple>();
      data::Feature one;
      one.kind = static_cast<data::Feature::Kind>(entry[1].cast<int>());
      switch (one.kind) {
        case data::Feature::Kind::none: break;
        case data::Feature::Kind::bytes: one.bytes = entry[2].cast<std::vector<std::string>>(); break;
        case data::Feature::Kind::floats: {
          const auto a = py::array_t<float, py::array::c_style | py::array::forcecast>::ensure(entry[2]);
          one.floats.assign(a.data(), a.data() + a.size());
          break;
        }
        case data::Feature::Kind::int64s: {
          const auto a = py::array_t<std::int64_t, py::array::c_style | py::array::forcecast>::ensure(entry[2]);
          one.int64s.assign(a.data(), a.data() + a.size());
          break;
        }
      }
      f[entry[0].cast<std::string>()] = std::move(one);
    }
    return py::bytes(data::serialize_example(f));
  });
  d.def("parse_example_message", [](const py::bytes& bytes) {
    const data::Features f = data::parse_example_message(std::string_view(bytes));
    py::list out;
    for (const auto& [key, one] : f) {
      py::object values = py::none();
      switch (one.kind) {
        case data::Feature::Kind::none: break;
        case data::Feature::Kind::bytes: {
          py::list b;
          for (const std::string& s : one.bytes) b.append(py::bytes(s));
          values = b;
          break;
        }
        case data::Feature::Kind::floats: values = py::array_t<float>(one.floats.size(), one.floats.data()); break;
        case data::Feature::Kind::int64s: values = py::array_t<std::int64_t>(one.int64s.size(), one.int64s.data()); break;
      }
      out.append(py::make_tuple(py::bytes(key), static_cast<int>(one.kind), values));
    }
    return out;
  });
  // specs: (key, kind 0 fixed_len / 1 var_len / 2 fixed_len_sequence, dtype, shape,
  // default or None, allow_missing). Gives (values, indices, dense_shape) per spec, the
  // last two None but for var_len.
  d.def("parse_examples", [](py::handle serialized, const py::list& specs) {
    const Tensor in = to_tensor(serialized, "parse_example", "string");
    std::vector<data::FeatureSpec> s;
    for (py::handle item : specs) {
      const auto t = item.cast<py::tuple>();
      data::FeatureSpec spec;
      spec.key = t[0].cast<std::string>();
      spec.kind = static_cast<data::FeatureSpec::Kind>(t[1].cast<int>());
      spec.dtype = dtype_from_name(t[2].cast<std::string>(), "parse_example");
      spec.shape = Shape(t[3].cast<std::vector<std::int64_t>>());
      if (!t[4].is_none()) spec.default_value = to_tensor(t[4], "parse_example: default_value", t[2].cast<std::string>());
      spec.allow_missing = t[5].cast<bool>();
      s.push_back(std::move(spec));
    }
    std::vector<data::ParsedFeature> parsed;
    {
      py::gil_scoped_release release;
      parsed = data::parse_examples(in, s);
    }
    py::list out;
    for (const auto& p : parsed)
      out.append(py::make_tuple(p.values, p.indices.defined() ? py::cast(p.indices) : py::none(),
                                p.dense_shape.defined() ? py::cast(p.dense_shape) : py::none()));
    return out;
  });
  d.def("serialize_tensor", [](py::handle t) {
    return py::bytes(data::serialize_tensor(to_tensor(t, "serialize_tensor")));
  });
  d.def("parse_tensor", [](const py::bytes& bytes, const std::string& dtype) {
    return data::parse_tensor(std::string_view(bytes), dtype_from_name(dtype, "parse_tensor"));
  });
  d.def("decode_raw", [](py::handle bytes, const std::string& dtype, bool little_endian) {
    return data::decode_raw(to_tensor(bytes, "decode_raw", "string"), dtype_from_name(dtype, "decode_raw"), little_endian);
  });
  py::class_<data::Dataset>(d, "_Dataset")
      .def_static("from_tensor_slices", [](py::list tensors) {
        std::vector<Tensor> ts;
        for (py::handle t : tensors) ts.push_back(to_tensor(t, "Dataset.from_tensor_slices"));
        return data::Dataset::from_tensor_slices(std::move(ts));
      })
      .def_static("from_generator", [](py::function make, std::vector<std::string> dtypes) {
        struct State {
          std::shared_ptr<py::object> make, iterator;
        };
        auto state = std::make_shared<State>(State{hold(std::move(make)), nullptr});
        return data::Dataset::from_generator([state, dtypes](std::int64_t index) -> std::optional<data::Element> {
          py::gil_scoped_acquire gil;
          if (index == 0 || !state->iterator) state->iterator = hold(py::iter((*state->make)()));
          py::object it = *state->iterator;
          PyObject* item = PyIter_Next(it.ptr());
          if (!item) {
            if (!PyErr_Occurred()) return std::nullopt;
            py::error_already_set error;
            // A ValueError (InvalidArgumentError among them: a shape the signature refuses)
            // stays one through the pipeline.
            if (error.matches(PyExc_ValueError)) DTRAIN_THROW(InvalidArgument, py::str(error.value()).cast<std::string>());
            throw error;
          }
          return element_of(py::reinterpret_steal<py::object>(item), dtypes, "Dataset.from_generator");
        });
      })
      .def_static("range", [](std::int64_t start, std::int64_t stop, std::int64_t step) {
        return data::Dataset::range(start, stop, step);
      })
      .def_static("from_idx", &data::Dataset::from_idx)
      .def_static("text_lines", &data::Dataset::text_lines)
      .def_static("tfrecord", [](std::vector<std::string> files, const std::string& compression, std::int64_t parallel) {
        return data::Dataset::tfrecord(std::move(files), data::compression_named(compression, "TFRecordDataset"), parallel);
      })
      .def_static("file_names", &data::Dataset::file_names)
      .def_static("glob", &data::Dataset::glob)
      // fn(parts...) returns the C++ dataset of the Python one the user's function made.
      .def("interleave", [](const data::Dataset& ds, py::function fn, std::int64_t cycle, std::int64_t block,
                            std::int64_t parallel) {
        auto f = hold(std::move(fn));
        return ds.interleave([f](const data::Element& e) {
          py::gil_scoped_acquire gil;
          return call_with(*f, e).cast<data::Dataset>();
        }, cycle, block, parallel);
      })
      .def("map", [](const data::Dataset& ds, py::function fn, std::int64_t parallel, bool deterministic) {
        auto f = hold(std::move(fn));
        return ds.map([f](const data::Element& e) {
          py::gil_scoped_acquire gil;
          return element_of(call_with(*f, e), {}, "Dataset.map");
        }, parallel, deterministic);
      })
      // The components at `indices`, in that order (a model's inputs, then its targets).
      .def("_select", [](const data::Dataset& ds, std::vector<std::size_t> indices) {
        return ds.map([indices](const data::Element& e) {
          data::Element out;
          out.reserve(indices.size());
          for (std::size_t i : indices) {
            if (i >= e.size())
              DTRAIN_THROW(InvalidArgument, "Dataset: an element of ", e.size(), " component(s) has no component ", i);
            out.push_back(e[i]);
          }
          return out;
        });
      })
      .def("filter", [](const data::Dataset& ds, py::function fn) {
        auto f = hold(std::move(fn));
        auto numpy_bool = hold(py::module_::import("numpy").attr("bool_"));  // looked up once, not per element
        return ds.filter([f, numpy_bool](const data::Element& e) {
          py::gil_scoped_acquire gil;
          py::object keep = call_with(*f, e);
          if (py::isinstance<Tensor>(keep)) {
            const Tensor t = keep.cast<Tensor>();
            if (t.numel() != 1)
              DTRAIN_THROW(InvalidArgument, "Dataset.filter: the predicate must return one bool, got a tensor of shape ",
                           t.shape().to_string());
            return t.item() != 0.0f;
          }
          // A bool, Python's or numpy's; 3 or None is a mistake, not a truth value.
          if (!py::isinstance<py::bool_>(keep) && !py::isinstance(keep, *numpy_bool))
            DTRAIN_THROW(InvalidArgument, "Dataset.filter: the predicate must return a bool, got ",
                         py::repr(keep).cast<std::string>().substr(0, 80));
          return keep.cast<bool>();
        });
      })
      .def("shuffle", [](const data::Dataset& ds, std::int64_t buffer, std::optional<std::uint64_t> seed, bool reshuffle) {
        return ds.shuffle(buffer, seed, reshuffle);
      })
      .def("batch", &data::Dataset::batch)
      .def("unbatch", &data::Dataset::unbatch)
      .def("repeat", &data::Dataset::repeat)
      .def("take", &data::Dataset::take)
      .def("skip", &data::Dataset::skip)
      .def("shard", &data::Dataset::shard)
      .def("cache", &data::Dataset::cache)
      .def("prefetch", &data::Dataset::prefetch)
      .def("prefetch_to_device",
           [](const data::Dataset& ds, const std::string& device, std::int64_t buffer_size) {
             return ds.prefetch_to_device(parse_device(device), buffer_size);
           })
      .def("with_shard_policy", [](const data::Dataset& ds, data::AutoShardPolicy policy) {
        data::DatasetOptions o = ds.options();
        o.auto_shard_policy = policy;
        return ds.with_options(o);
      })
      .def("cardinality", &data::Dataset::cardinality)
      .def("make_iterator", [](const data::Dataset& ds, std::uint64_t iteration) {
        py::gil_scoped_release release;
        return std::make_unique<PyIterator>(ds.make_iterator(iteration));
      }, py::arg("iteration") = 0);

  py::class_<data::SentencePiece>(d, "_SentencePiece")
      .def_static("train", [](const data::Dataset& ds, int vocab_size, const std::string& model_type,
                              double character_coverage, std::int64_t max_sentences, bool lowercase,
                              std::map<std::string, std::string> extra) {
        const data::SentencePieceOptions o{vocab_size, model_type, character_coverage, max_sentences, lowercase,
                                           std::move(extra)};
        py::gil_scoped_release release;  // a map function of the dataset takes the GIL back
        return data::SentencePiece::train(ds, o);
      })
      .def_static("from_bytes", [](py::bytes proto) { return data::SentencePiece::from_bytes(std::string(proto)); })
      .def_static("load", &data::SentencePiece::load)
      .def("serialized", [](const data::SentencePiece& sp) { return py::bytes(sp.serialized()); })
      .def("save", &data::SentencePiece::save)
      // Each string's ids (a list of lists), without the GIL.
      .def("encode", [](const data::SentencePiece& sp, const std::vector<std::string>& texts) {
        std::vector<std::vector<std::int32_t>> out(texts.size());
        {
          py::gil_scoped_release release;
          for (std::size_t i = 0; i < texts.size(); ++i) out[i] = sp.encode(texts[i]);
        }
        return out;
      })
      .def("encode_pieces", &data::SentencePiece::encode_pieces)
      .def("decode", [](const data::SentencePiece& sp, const std::vector<std::int32_t>& ids) {
        return py::bytes(sp.decode(ids));
      })
      .def("vocab_size", &data::SentencePiece::vocab_size)
      .def("id_to_piece", &data::SentencePiece::id_to_piece)
      .def("piece_to_id", &data::SentencePiece::piece_to_id)
      .def("unk_id", &data::SentencePiece::unk_id)
      .def("bos_id", &data::SentencePiece::bos_id)
      .def("eos_id", &data::SentencePiece::eos_id)
      .def("pad_id", &data::SentencePiece::pad_id);
}

}  // namespace dtrain::python
