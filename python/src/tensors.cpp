// Tensors and numpy, variables, the ops a custom loop writes, GradientTape, and dtrain's
// errors as Python exceptions.
#include <pybind11/stl.h>

#include <cstring>
#include <optional>

#include "bindings.h"

namespace dtrain::python {
namespace {

Shape shape_of(const py::array& a, const char* what) {
  if (a.ndim() > Shape::kMaxRank)
    throw py::value_error(std::string(what) + ": an array of rank " + std::to_string(a.ndim()) +
                          ", above dtrain's largest rank " + std::to_string(Shape::kMaxRank));
  std::vector<std::int64_t> dims(a.shape(), a.shape() + a.ndim());
  return Shape(dims);
}

std::string numpy_dtype_name(const py::array& a) { return py::str(a.dtype()).cast<std::string>(); }

// The dtype a numpy array becomes without a requested one.
DType natural_dtype(const py::array& a, const char* what) {
  const char kind = a.dtype().kind();
  if (kind == 'f') return DType::f32;
  if (kind == 'i' || kind == 'b') return DType::i32;
  if (kind == 'u') return a.dtype().itemsize() == 1 ? DType::u8 : DType::i32;
  if (kind == 'U' || kind == 'S' || kind == 'O') return DType::string;  // 'O': checked to hold str or bytes
  throw py::type_error(std::string(what) + ": an array of " + numpy_dtype_name(a) +
                       ", which dtrain cannot hold (float32, int32, uint8 and strings)");
}

const char* numpy_name(DType t) {
  switch (t) {
    case DType::f32: return "float32";
    case DType::i32: return "int32";
    case DType::u8: return "uint8";
    case DType::bf16: return "float32";  // converted on the way out
    case DType::f16: return "float16";
    case DType::string: return "object";   // of bytes, as TensorFlow gives them
  }
  return "float32";
}

// Integers that do not fit int32 are refused rather than wrapped.
void check_int32_range(const py::array& a, const char* what) {
  const char kind = a.dtype().kind();
  if ((kind != 'i' && kind != 'u') || a.dtype().itemsize() < 4 || a.size() == 0) return;
  if (kind == 'i' && a.dtype().itemsize() == 4) return;
  const py::object lo = a.attr("min")(), hi = a.attr("max")();
  if (lo.cast<long long>() < INT32_MIN || hi.cast<long long>() > INT32_MAX)
    throw py::value_error(std::string(what) + ": values from " + py::str(lo).cast<std::string>() + " to " +
                          py::str(hi).cast<std::string>() + " do not fit int32");
}

// An array of str (UTF-8 encoded), bytes, or objects that are each one of them, as a
// string tensor; `want` must be string.
Tensor string_tensor(const py::array& a, const char* what, DType want) {
  if (want != DType::string)
    throw py::type_error(std::string(what) + ": an array of " + numpy_dtype_name(a) + " where " +
                         std::string(dtype_name(want)) + " is asked for (strings do not convert to numbers)");
  const char kind = a.dtype().kind();
  if (kind != 'U' && kind != 'S' && kind != 'O')
    throw py::type_error(std::string(what) + ": an array of " + numpy_dtype_name(a) +
                         " where strings are asked for (numbers do not convert to strings)");
  const py::list items = a.attr("ravel")().attr("tolist")();
  std::vector<std::string> values;
  values.reserve(items.size());
  for (std::size_t i = 0; i < items.size(); ++i) {
    const py::handle item = items[i];
    if (py::isinstance<py::bytes>(item)) values.push_back(item.cast<std::string>());
    else if (py::isinstance<py::str>(item)) values.push_back(item.cast<std::string>());  // UTF-8
    else
      throw py::type_error(std::string(what) + ": an array of " + numpy_dtype_name(a) + " whose element " +
                           std::to_string(i) + " is a " +
                           py::str(py::type::handle_of(item).attr("__name__")).cast<std::string>() +
                           ": dtrain holds numbers (float32, int32, uint8) and strings (str or bytes)");
  }
  return Tensor::from_vector(shape_of(a, what), std::move(values));
}

}  // namespace

std::shared_ptr<py::object> hold(py::object object) {
  return std::shared_ptr<py::object>(new py::object(std::move(object)), [](py::object* p) {
    if (!Py_IsInitialized()) return;
    py::gil_scoped_acquire gil;
    delete p;
  });
}

DType dtype_from_name(const std::string& name, const char* what) {
  if (name == "float32" || name == "float") return DType::f32;
  if (name == "int32" || name == "int64" || name == "int" || name == "bool") return DType::i32;
  if (name == "uint8") return DType::u8;
  if (name == "bfloat16") return DType::bf16;
  if (name == "float16" || name == "half") return DType::f16;
  if (name == "string") return DType::string;
  throw py::type_error(std::string(what) + ": dtype '" + name +
                       "' is not one dtrain has (float32, bfloat16, float16, int32, int64 as int32, uint8, string)");
}

Tensor to_tensor(py::handle value, const char* what, const std::string& dtype) {
  if (py::isinstance<Tensor>(value) || py::isinstance<Variable>(value)) {
    Tensor t = py::isinstance<Tensor>(value) ? value.cast<Tensor>() : value.cast<Variable&>().value();
    if (dtype.empty()) return t;
    const DType want = dtype_from_name(dtype, what);
    if (is_floating(t.dtype()) && (want == DType::i32 || want == DType::u8))
      throw py::type_error(std::string(what) + ": a " + std::string(dtype_name(t.dtype())) + " tensor where " +
                           numpy_name(want) + " is asked for (it would be truncated)");
    return t.dtype() == want ? t : t.astype(want);
  }
  py::array a = py::array::ensure(value);
  if (!a)
    throw py::type_error(std::string(what) + ": expected a tensor, an array or a number, got " +
                         py::str(py::type::handle_of(value).attr("__name__")).cast<std::string>());
  const DType want = dtype.empty() ? natural_dtype(a, what) : dtype_from_name(dtype, what);
  const char kind = a.dtype().kind();
  // Text, or text asked for; an array of objects asked to be numbers converts as numpy does.
  if (want == DType::string || kind == 'U' || kind == 'S') return string_tensor(a, what, want);
  if (is_half(want)) return to_tensor(a, what, "float32").astype(want);
  if (want != DType::f32) {
    if (a.dtype().kind() == 'f')
      throw py::type_error(std::string(what) + ": an array of " + numpy_dtype_name(a) + " where " +
                           numpy_name(want) + " is asked for");
    check_int32_range(a, what);
  }
  const Shape shape = shape_of(a, what);
  // A read-only array (a memmap opened "r", np.frombuffer of bytes) is copied: the tensor's
  // memory is written through .numpy() and by ops in place.
  const bool exact = a.dtype().is(py::dtype(numpy_name(want))) &&
                     (a.flags() & py::array::c_style) == py::array::c_style && a.writeable();
  if (!exact) a = py::array(a.attr("astype")(py::dtype(numpy_name(want)), py::arg("order") = "C"));
  void* data = const_cast<void*>(a.data());
  return Tensor::over(data, shape, want, hold(std::move(a)));  // the tensor keeps the array alive
}

py::array to_numpy(const Tensor& tensor) {
  tensor.check_defined("numpy");
  if (tensor.dtype() == DType::string) {
    py::array out(py::dtype("object"), std::vector<py::ssize_t>(tensor.shape().dims().begin(), tensor.shape().dims().end()));
    const std::string* v = tensor.data<std::string>();
    py::object flat = out.attr("reshape")(-1);
    for (std::int64_t i = 0; i < tensor.numel(); ++i) flat[py::int_(i)] = py::bytes(v[i]);
    return out;
  }
  // A GPU tensor's values are copied to the host (sharing is for the CPU's).
  const Tensor host = tensor.to(Device::cpu());
  const Tensor t = host.dtype() == DType::bf16 ? host.astype(DType::f32) : host;
  std::vector<py::ssize_t> shape(t.shape().dims().begin(), t.shape().dims().end());
  py::capsule owner(new Tensor(t), [](void* p) { delete static_cast<Tensor*>(p); });
  return py::array(py::dtype(numpy_name(t.dtype())), shape, t.raw_data(), owner);
}

namespace {

bool is_number(py::handle v) { return py::isinstance<py::float_>(v) || py::isinstance<py::int_>(v); }

// a OP b where either side may be a number (filled out to the other's shape and dtype) or
// anything to_tensor takes.
template <typename Op>
Tensor binary(py::handle a, py::handle b, Op op, const char* what) {
  if (is_number(a) && is_number(b)) throw py::type_error(std::string(what) + ": needs a tensor on one side");
  Tensor ta = is_number(a) ? Tensor() : to_tensor(a, what);
  Tensor tb = is_number(b) ? Tensor() : to_tensor(b, what);
  if (!ta.defined()) ta = Tensor::full(tb.shape(), a.cast<float>()).astype(tb.dtype());
  if (!tb.defined()) tb = Tensor::full(ta.shape(), b.cast<float>()).astype(ta.dtype());
  // Of two dtypes, a tensor's or variable's rules over an array's (numpy's ints on the
  // left of a float tensor), and the left one's over the right one's.
  const auto given = [](py::handle x) { return py::isinstance<Tensor>(x) || py::isinstance<Variable>(x); };
  if (ta.dtype() != tb.dtype() && !given(a) && given(b)) ta = ta.astype(tb.dtype());
  if (ta.dtype() != tb.dtype()) tb = tb.astype(ta.dtype());
  // As TensorFlow's eager ops: an op with an operand on a GPU runs there, and an operand
  // on the host (an array, a number, a tf.constant) is copied to it first.
  if (!(ta.device() == tb.device())) {
    if (ta.on_cpu()) ta = ta.to(tb.device());
    else if (tb.on_cpu()) tb = tb.to(ta.device());
  }
  py::gil_scoped_release release;
  return op(ta, tb);
}

std::optional<std::vector<int>> axes_of(py::object axis) {
  if (axis.is_none()) return std::nullopt;
  if (py::isinstance<py::int_>(axis)) return std::vector<int>{axis.cast<int>()};
  return axis.cast<std::vector<int>>();
}

template <typename Reduce>
Tensor reduce(py::handle x, py::object axis, bool keepdims, Reduce op, const char* what) {
  Tensor t = to_tensor(x, what);
  std::optional<std::vector<int>> axes = axes_of(std::move(axis));
  py::gil_scoped_release release;
  if (!axes) {
    Tensor all = op(t, std::vector<int>(), false);
    return keepdims ? all.reshape(Shape(std::vector<std::int64_t>(static_cast<size_t>(t.rank()), 1))) : all;
  }
  return op(t, *axes, keepdims);
}

Shape shape_from(py::handle shape, const char* what) {
  if (py::isinstance<Tensor>(shape)) return shape.cast<Tensor>().shape();
  if (py::isinstance<py::int_>(shape)) return Shape{shape.cast<std::int64_t>()};
  try {
    return Shape(shape.cast<std::vector<std::int64_t>>());
  } catch (const py::cast_error&) {
    throw py::type_error(std::string(what) + ": a shape is a tuple of ints");
  }
}

// GradientTape as Python's `with` uses it: made on entry, stopped on exit (its record
// kept for gradient() after the block, as TensorFlow allows).
class PyTape {
 public:
  explicit PyTape(bool persistent) : persistent_(persistent) {}
  void enter() {
    if (tape_) throw py::value_error("GradientTape: this tape was entered already; make a new one for each block");
    tape_ = std::make_unique<GradientTape>(persistent_);
  }
  void exit() { live().stop(); }
  void watch(py::handle x) {
    if (py::isinstance<py::list>(x) || py::isinstance<py::tuple>(x)) {
      for (py::handle item : x) watch(item);
      return;
    }
    if (py::isinstance<Variable>(x)) return live().watch(x.cast<Variable&>());
    live().watch(to_tensor(x, "GradientTape.watch"));
  }
  // A target may be a list or tuple of them (nested too): the gradient of their sum, as
  // TensorFlow gives it; output_gradients is then a list of as many (None: ones).
  py::list gradient(py::handle target, py::handle sources, py::handle output_gradients) {
    GradientTape& tape = live();
    std::vector<Tensor> ys, seeds;
    targets_and_seeds(target, py::reinterpret_borrow<py::object>(output_gradients), ys, seeds);
    std::vector<Tensor> xs;
    for (py::handle s : sources) {
      if (py::isinstance<Variable>(s))
        xs.push_back(s.cast<Variable&>().mutable_value());  // the same identity, not read again
      else
        xs.push_back(to_tensor(s, "GradientTape.gradient sources"));
    }
    std::vector<Tensor> grads;
    {
      py::gil_scoped_release release;
      grads = tape.gradient(ys, xs, seeds);
    }
    py::list out;
    for (Tensor& g : grads) out.append(g.defined() ? py::cast(std::move(g)) : py::none());
    return out;
  }

 private:
  static bool is_sequence(py::handle x) { return py::isinstance<py::list>(x) || py::isinstance<py::tuple>(x); }
  // The tensors of `target` (a tensor or a nested list or tuple of them) in order, and each
  // one's output gradient from `seed`, which has the target's structure: a tensor, array or
  // nested list of numbers where the target has a tensor, None (ones) anywhere. A single
  // target's output gradient may also come as a list of one tensor, as TensorFlow takes it.
  static void targets_and_seeds(py::handle target, py::object seed, std::vector<Tensor>& ys,
                                std::vector<Tensor>& seeds) {
    if (is_sequence(target)) {
      const std::size_t n = py::len(target);
      if (n == 1 && !seed.is_none() && !is_sequence(seed)) seed = py::make_tuple(seed);  // [y] with g
      if (!seed.is_none() && (!is_sequence(seed) || py::len(seed) != n))
        throw py::value_error("GradientTape.gradient: output_gradients must have the target's structure, a list of " +
                              std::to_string(n) + " there, got " + py::repr(seed).cast<std::string>());
      for (std::size_t i = 0; i < n; ++i)
        targets_and_seeds(py::object(target[py::int_(i)]), seed.is_none() ? py::none() : py::object(seed[py::int_(i)]),
                          ys, seeds);
      return;
    }
    ys.push_back(to_tensor(target, "GradientTape.gradient target"));
    if (is_sequence(seed) && py::len(seed) == 1) {
      py::object only = seed[py::int_(0)];
      if (py::isinstance<Tensor>(only) || py::isinstance<Variable>(only) || py::isinstance<py::array>(only)) seed = only;
    }
    seeds.push_back(seed.is_none() ? Tensor() : to_tensor(seed, "GradientTape.gradient output_gradients"));
  }
  GradientTape& live() {
    if (!tape_) throw py::value_error("GradientTape: used outside its `with` block before entering it");
    return *tape_;
  }
  bool persistent_;
  std::unique_ptr<GradientTape> tape_;
};

}  // namespace

namespace {

// `text` with every byte that Python's strict UTF-8 decoder refuses written as \xNN: a
// message that quotes a damaged file's bytes reached Python with no message at all.
// Called with the GIL held (exception translators are).
std::string valid_utf8(const std::string& text) {
  PyObject* decoded = PyUnicode_DecodeUTF8(text.data(), static_cast<Py_ssize_t>(text.size()), "backslashreplace");
  if (!decoded) {
    PyErr_Clear();
    return text;
  }
  return py::reinterpret_steal<py::str>(decoded).cast<std::string>();
}

template <typename Kind>
void rethrow_valid(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const Kind& e) {
    throw Kind(valid_utf8(e.what()));
  }
}

}  // namespace

void bind_errors(py::module_& m) {
  py::module_ errors = m.def_submodule("errors", "dtrain's errors, as TensorFlow's tf.errors names them");
  // Most general first: pybind11 tries the last registered first.
  py::register_exception<Error>(errors, "OpError", PyExc_RuntimeError);
  py::register_exception<InternalError>(errors, "InternalError", PyExc_RuntimeError);
  py::register_exception<PeerFailure>(errors, "PeerFailureError", PyExc_RuntimeError);
  py::register_exception<Cancelled>(errors, "CancelledError", PyExc_RuntimeError);
  py::register_exception<Preempted>(errors, "PreemptedError", PyExc_RuntimeError);
  py::register_exception<Unavailable>(errors, "UnavailableError", PyExc_ConnectionError);
  py::register_exception<Timeout>(errors, "DeadlineExceededError", PyExc_TimeoutError);
  py::register_exception<ResourceExhausted>(errors, "ResourceExhaustedError", PyExc_MemoryError);
  py::register_exception<Unsupported>(errors, "UnimplementedError", PyExc_NotImplementedError);
  py::register_exception<IoError>(errors, "IoError", PyExc_OSError);
  py::register_exception<InvalidArgument>(errors, "InvalidArgumentError", PyExc_ValueError);
  errors.attr("PREEMPTED_EXIT_CODE") = kPreemptedExitCode;
  // Tried first (the last registered is): a message that is not UTF-8 is made so, and the
  // same kind of error goes on to the translators above.
  py::register_exception_translator([](std::exception_ptr error) {
    try {
      std::rethrow_exception(error);
    } catch (const Error& e) {
      const std::string what = e.what();
      if (valid_utf8(what) == what) throw;
      if (dynamic_cast<const InvalidArgument*>(&e)) rethrow_valid<InvalidArgument>(error);
      if (dynamic_cast<const IoError*>(&e)) rethrow_valid<IoError>(error);
      if (dynamic_cast<const ResourceExhausted*>(&e)) rethrow_valid<ResourceExhausted>(error);
      if (dynamic_cast<const Unsupported*>(&e)) rethrow_valid<Unsupported>(error);
      if (dynamic_cast<const InternalError*>(&e)) rethrow_valid<InternalError>(error);
      if (dynamic_cast<const Timeout*>(&e)) rethrow_valid<Timeout>(error);
      if (dynamic_cast<const PeerFailure*>(&e)) rethrow_valid<PeerFailure>(error);
      if (dynamic_cast<const Unavailable*>(&e)) rethrow_valid<Unavailable>(error);
      if (dynamic_cast<const Cancelled*>(&e)) rethrow_valid<Cancelled>(error);
      if (dynamic_cast<const Preempted*>(&e)) rethrow_valid<Preempted>(error);
      throw Error(valid_utf8(what));
    }
  });
}

namespace {

// + - * / @ of a tensor or variable with a number, an array, a tensor or a variable on
// either side, each recorded by live tapes (** and the comparisons: dtrain/_core.py).
template <typename Class>
void bind_arithmetic(Class& c) {
  const auto matmul = [](const Tensor& x, const Tensor& y) { return dtrain::matmul(x, y); };
  c.def("__add__", [](py::object a, py::object b) { return binary(a, b, dtrain::add, "+"); })
      .def("__radd__", [](py::object a, py::object b) { return binary(b, a, dtrain::add, "+"); })
      .def("__sub__", [](py::object a, py::object b) { return binary(a, b, dtrain::sub, "-"); })
      .def("__rsub__", [](py::object a, py::object b) { return binary(b, a, dtrain::sub, "-"); })
      .def("__mul__", [](py::object a, py::object b) { return binary(a, b, dtrain::mul, "*"); })
      .def("__rmul__", [](py::object a, py::object b) { return binary(b, a, dtrain::mul, "*"); })
      .def("__truediv__", [](py::object a, py::object b) { return binary(a, b, dtrain::div, "/"); })
      .def("__rtruediv__", [](py::object a, py::object b) { return binary(b, a, dtrain::div, "/"); })
      .def("__matmul__", [matmul](py::object a, py::object b) { return binary(a, b, matmul, "@"); })
      .def("__rmatmul__", [matmul](py::object a, py::object b) { return binary(b, a, matmul, "@"); });
}

}  // namespace

void bind_tensors(py::module_& m) {
  py::class_<Tensor> tensor(m, "Tensor", "A dense row-major array: dtrain's tf.Tensor");
  tensor
      .def(py::init([](py::handle value, const std::string& dtype) { return to_tensor(value, "Tensor", dtype).clone(); }),
           py::arg("value"), py::arg("dtype") = "")
      .def_property_readonly("shape", [](const Tensor& t) { return py::tuple(py::cast(t.shape().to_vector())); })
      .def_property_readonly("dtype", [](const Tensor& t) { return std::string(dtype_name(t.dtype())); })
      .def_property_readonly("ndim", &Tensor::rank)
      .def_property_readonly("device", [](const Tensor& t) { return "/job:localhost/replica:0/task:0" + t.device().tf_name(); })
      .def("numpy", [](const Tensor& t) -> py::object {
             // A string scalar is its bytes, as TensorFlow gives it.
             if (t.dtype() == DType::string && t.rank() == 0) return py::bytes(*t.data<std::string>());
             return to_numpy(t);
           }, "The values as a numpy array sharing this tensor's memory (a string tensor's: bytes objects, copied)")
      .def("__array__", [](const Tensor& t, py::object dtype, py::object /*copy*/) {
             py::array a = to_numpy(t);
             return dtype.is_none() ? a : py::array(a.attr("astype")(dtype));
           }, py::arg("dtype") = py::none(), py::arg("copy") = py::none())
      .def("item", [](const Tensor& t) { return to_numpy(t).attr("item")(); })
      // f"{loss:.4f}" on a scalar, as on a number (and on TensorFlow's eager tensors).
      .def("__format__", [](const Tensor& t, const std::string& spec) {
        py::object value = t.numel() == 1 ? to_numpy(t).attr("item")() : py::object(py::str(to_numpy(t)));
        return value.attr("__format__")(spec).cast<std::string>();
      })
      .def("__float__", [](const Tensor& t) { return static_cast<double>(t.item()); })
      .def("__int__", [](const Tensor& t) { return static_cast<long long>(t.item()); })
      .def("__bool__", [](const Tensor& t) {  // `if tensor:` of several values is a mistake, as in TensorFlow
        if (t.numel() != 1)
          throw py::value_error("the truth value of a tensor of shape " + t.shape().to_string() +
                                " is ambiguous: test one value, or reduce the tensor to one first");
        return t.item() != 0.0f;
      })
      .def("__len__", [](const Tensor& t) {
        if (t.rank() == 0) throw py::type_error("len() of a scalar tensor");
        return t.dim(0);
      })
      .def("__getitem__", [](const Tensor& t, py::object index) {
        py::object part = to_numpy(t)[std::move(index)];
        return to_tensor(py::array::ensure(part), "Tensor[...]").clone();
      })
      .def("__repr__", [](const Tensor& t) {
        return "<dtrain.Tensor: shape=" + py::repr(py::tuple(py::cast(t.shape().to_vector()))).cast<std::string>() +
               ", dtype=" + std::string(dtype_name(t.dtype())) + ", numpy=" +
               py::repr(to_numpy(t)).cast<std::string>() + ">";
      })
      .def("__neg__", [](const Tensor& t) { return dtrain::affine(t, -1.0f); });
  bind_arithmetic(tensor);

  py::class_<Variable> variable(m, "Variable", "A named, mutable tensor that training updates");
  variable
      .def(py::init([](py::handle initial_value, bool trainable, const std::string& name, py::object dtype) {
             // dtype as TensorFlow programs give it (tf.int64, np.float64, "float32"): the
             // dtype dtrain holds for it (int64 as int32, float64 as float32).
             const std::string held =
                 dtype.is_none() ? "" : py::module_::import("dtrain._core").attr("_dtype_name")(dtype).cast<std::string>();
             // Made where the placement says (`with tf.device(...)`, a GPU by default where one is).
             const Tensor initial = to_tensor(initial_value, "Variable", held);
             if (initial.dtype() == DType::string)
               throw py::type_error("Variable '" + name + "': strings cannot be a variable (dtrain's variables hold "
                                    "the numbers training updates, saved in checkpoints); keep the text in a tensor");
             const Device where = placement();
             return std::make_unique<Variable>(name, initial.device() == where ? initial.clone() : initial.to(where),
                                               trainable);
           }),
           py::arg("initial_value"), py::arg("trainable") = true, py::arg("name") = "Variable", py::arg("dtype") = py::none())
      .def_property_readonly("name", &Variable::name)
      .def_property_readonly("shape", [](const Variable& v) { return py::tuple(py::cast(v.shape().to_vector())); })
      .def_property_readonly("dtype", [](const Variable& v) { return std::string(dtype_name(v.dtype())); })
      .def_property("trainable", &Variable::trainable, &Variable::set_trainable)
      .def("value", [](const Variable& v) { return v.value(); }, "The current value (watched by live tapes)")
      .def("read_value", [](const Variable& v) { return v.value(); })
      .def("numpy", [](Variable& v) { return to_numpy(v.mutable_value().clone()); }, "A copy of the current value")
      .def("__array__", [](Variable& v, py::object dtype, py::object) {
             py::array a = to_numpy(v.mutable_value().clone());
             return dtype.is_none() ? a : py::array(a.attr("astype")(dtype));
           }, py::arg("dtype") = py::none(), py::arg("copy") = py::none())
      .def("assign", [](Variable& v, py::handle value) {
        v.assign(to_tensor(value, v.name().c_str(), std::string(dtype_name(v.dtype()))));
      })
      .def("assign_add", [](Variable& v, py::handle delta) {
        v.assign(dtrain::add(v.mutable_value(), to_tensor(delta, v.name().c_str(), std::string(dtype_name(v.dtype())))));
      })
      .def("assign_sub", [](Variable& v, py::handle delta) {
        v.assign(dtrain::sub(v.mutable_value(), to_tensor(delta, v.name().c_str(), std::string(dtype_name(v.dtype())))));
      })
      .def("__repr__", [](Variable& v) {
        return "<dtrain.Variable '" + v.name() + "' shape=" +
               py::repr(py::tuple(py::cast(v.shape().to_vector()))).cast<std::string>() + " dtype=" +
               std::string(dtype_name(v.dtype())) + ">";
      })
      .def("__neg__", [](const Variable& v) { return dtrain::affine(v.value(), -1.0f); });
  bind_arithmetic(variable);

  m.def("convert_to_tensor", [](py::handle value, const std::string& dtype) { return to_tensor(value, "convert_to_tensor", dtype); },
        py::arg("value"), py::arg("dtype") = "");

  py::module_ o = m.def_submodule("ops", "The ops a custom loop writes (each recorded by live tapes)");
  auto unary = [&o](const char* name, Tensor (*fn)(const Tensor&)) {
    o.def(name, [fn, name](py::handle x) {
      Tensor t = to_tensor(x, name);
      py::gil_scoped_release release;
      return fn(t);
    });
  };
  unary("relu", dtrain::relu);
  unary("sigmoid", dtrain::sigmoid);
  unary("tanh", dtrain::tanh);
  unary("exp", dtrain::exp);
  unary("log", dtrain::log);
  unary("square", dtrain::square);
  unary("sqrt", dtrain::sqrt);
  unary("abs", dtrain::abs);
  unary("softmax", dtrain::softmax);
  unary("log_softmax", dtrain::log_softmax);
  unary("stop_gradient", dtrain::stop_gradient);
  o.def("gelu", [](py::handle x, bool approximate) {
    Tensor t = to_tensor(x, "gelu");
    py::gil_scoped_release release;
    return dtrain::gelu(t, approximate);
  }, py::arg("features"), py::arg("approximate") = false);
  o.def("add", [](py::handle a, py::handle b) { return binary(a, b, dtrain::add, "add"); });
  o.def("subtract", [](py::handle a, py::handle b) { return binary(a, b, dtrain::sub, "subtract"); });
  o.def("multiply", [](py::handle a, py::handle b) { return binary(a, b, dtrain::mul, "multiply"); });
  o.def("divide", [](py::handle a, py::handle b) { return binary(a, b, dtrain::div, "divide"); });
  o.def("matmul", [](py::handle a, py::handle b, bool ta, bool tb) {
    Tensor x = to_tensor(a, "matmul"), y = to_tensor(b, "matmul");
    py::gil_scoped_release release;
    return dtrain::matmul(x, y, ta, tb);
  }, py::arg("a"), py::arg("b"), py::arg("transpose_a") = false, py::arg("transpose_b") = false);
  o.def("reduce_sum", [](py::handle x, py::object axis, bool keepdims) {
    return reduce(x, std::move(axis), keepdims, [](const Tensor& t, std::vector<int> axes, bool keep) {
      return axes.empty() ? dtrain::reduce_sum(t) : dtrain::reduce_sum(t, std::move(axes), keep);
    }, "reduce_sum");
  }, py::arg("input_tensor"), py::arg("axis") = py::none(), py::arg("keepdims") = false);
  o.def("reduce_mean", [](py::handle x, py::object axis, bool keepdims) {
    return reduce(x, std::move(axis), keepdims, [](const Tensor& t, std::vector<int> axes, bool keep) {
      return axes.empty() ? dtrain::reduce_mean(t) : dtrain::reduce_mean(t, std::move(axes), keep);
    }, "reduce_mean");
  }, py::arg("input_tensor"), py::arg("axis") = py::none(), py::arg("keepdims") = false);
  o.def("reshape", [](py::handle x, py::handle shape) {
    Tensor t = to_tensor(x, "reshape");
    // Read as numbers, not as a Shape, which refuses the -1 to be worked out.
    std::vector<std::int64_t> dims;
    if (py::isinstance<py::int_>(shape)) {
      dims = {shape.cast<std::int64_t>()};
    } else if (py::isinstance<Tensor>(shape)) {
      dims = shape_from(shape, "reshape").to_vector();
    } else {
      try {
        dims = shape.cast<std::vector<std::int64_t>>();
      } catch (const py::cast_error&) {
        throw py::type_error("reshape: a shape is a tuple of ints");
      }
    }
    std::int64_t known = 1;
    int unknown = -1;
    for (size_t i = 0; i < dims.size(); ++i) {
      if (dims[i] == -1) {
        if (unknown >= 0) throw py::value_error("reshape: at most one -1 in the shape");
        unknown = static_cast<int>(i);
      } else if (__builtin_mul_overflow(known, dims[i], &known)) {
        throw py::value_error("reshape: the shape holds more values than a tensor can");
      }
    }
    if (unknown >= 0 && known > 0) dims[static_cast<size_t>(unknown)] = t.numel() / known;
    return dtrain::reshape(t, Shape(dims));
  });
  // Selection (autograd/op_select.cpp), joining and slicing: each with its gradient.
  o.def("where", [](py::handle c, py::handle x, py::handle y) {
    Tensor cond = to_tensor(c, "where"), a = to_tensor(x, "where", "float32"), b = to_tensor(y, "where", "float32");
    py::gil_scoped_release release;
    return dtrain::where(cond, a, b);
  });
  o.def("gather", [](py::handle params, py::handle indices, int axis, int batch_dims) {
    Tensor p = to_tensor(params, "gather"), i = to_tensor(indices, "gather", "int32");
    py::gil_scoped_release release;
    return dtrain::gather(p, i, axis, batch_dims);
  });
  o.def("slice_axis", [](py::handle x, int axis, std::int64_t begin, std::int64_t size) {
    return dtrain::slice_axis(to_tensor(x, "split"), axis, begin, size);
  });
  o.def("concat", [](py::handle values, int axis) {
    std::vector<Tensor> ts;
    for (py::handle v : values) ts.push_back(to_tensor(v, "concat"));
    py::gil_scoped_release release;
    return dtrain::concatenate(ts, axis);
  });
  o.def("reduce_max", [](py::handle x, py::object axis, bool keepdims) {
    return reduce(x, std::move(axis), keepdims, [](const Tensor& t, std::vector<int> axes, bool keep) {
      return dtrain::reduce_max(t, std::move(axes), keep);
    }, "reduce_max");
  }, py::arg("input_tensor"), py::arg("axis") = py::none(), py::arg("keepdims") = false);
  o.def("reduce_min", [](py::handle x, py::object axis, bool keepdims) {
    return reduce(x, std::move(axis), keepdims, [](const Tensor& t, std::vector<int> axes, bool keep) {
      return dtrain::reduce_min(t, std::move(axes), keep);
    }, "reduce_min");
  }, py::arg("input_tensor"), py::arg("axis") = py::none(), py::arg("keepdims") = false);
  o.def("reduce_prod", [](py::handle x, py::object axis, bool keepdims) {
    return reduce(x, std::move(axis), keepdims, [](const Tensor& t, std::vector<int> axes, bool keep) {
      return dtrain::reduce_prod(t, std::move(axes), keep);
    }, "reduce_prod");
  }, py::arg("input_tensor"), py::arg("axis") = py::none(), py::arg("keepdims") = false);
  o.def("clip_by_value", [](py::handle x, float lo, float hi) { return dtrain::clip_by_value(to_tensor(x, "clip_by_value"), lo, hi); });
  o.def("one_hot", [](py::handle labels, std::int64_t depth) { return dtrain::one_hot(to_tensor(labels, "one_hot"), depth); });
  o.def("zeros", [](py::handle shape, const std::string& dtype) {
    return Tensor::zeros(shape_from(shape, "zeros"), dtype_from_name(dtype, "zeros"));
  }, py::arg("shape"), py::arg("dtype") = "float32");
  o.def("fill", [](py::handle shape, float value) { return Tensor::full(shape_from(shape, "fill"), value); });
  o.def("zeros_like", [](py::handle x) {
    const Tensor t = to_tensor(x, "zeros_like");
    return Tensor::zeros(t.shape(), t.dtype());
  });
  o.def("ones_like", [](py::handle x) {
    const Tensor t = to_tensor(x, "ones_like");
    return Tensor::full(t.shape(), 1.0f).astype(t.dtype());
  });
  o.def("compute_average_loss", [](py::handle per_example_loss, std::int64_t global_batch_size) {
    Tensor t = to_tensor(per_example_loss, "compute_average_loss");
    py::gil_scoped_release release;
    return distribute::compute_average_loss(t, global_batch_size);
  }, py::arg("per_example_loss"), py::arg("global_batch_size") = -1);

  o.def("scale_regularization_loss", [](py::handle loss) {
    return distribute::scale_regularization_loss(to_tensor(loss, "scale_regularization_loss"));
  });
  o.def("add_n", [](py::handle inputs) {
    std::vector<Tensor> ts;
    for (py::handle x : inputs) ts.push_back(to_tensor(x, "add_n"));
    return dtrain::add_n(ts);
  });

  py::class_<PyTape>(m, "_GradientTape")
      .def(py::init<bool>(), py::arg("persistent") = false)
      .def("enter", &PyTape::enter)
      .def("exit", &PyTape::exit)
      .def("watch", &PyTape::watch)
      .def("gradient", &PyTape::gradient, py::arg("target"), py::arg("sources"), py::arg("output_gradients") = py::none());

  m.def("set_random_seed", &set_random_seed, py::arg("seed"));
  m.def("next_seed", &next_seed);
  m.def("set_num_threads", &set_num_threads, py::arg("n"));
  // Devices (tf.config, tf.device): what this process has and where things are placed.
  m.def("_gpu_count", [] { return device_count(DeviceType::cuda); });
  m.def("_built_with_cuda", [] {
    const DeviceRuntime* r = device_runtime(DeviceType::cuda);
    return r != nullptr && std::string(r->name()) == "CUDA";
  });
  m.def("_describe_gpus", [] { return describe_devices(DeviceType::cuda); });
  m.def("_set_default_placement", [](const std::string& spec) { set_default_placement(spec); });
  m.def("_placement", [] { return placement().tf_name(); });
  m.def("_exchange_placement", [](py::object device) {
    std::optional<Device> d;
    if (!device.is_none()) d = parse_device(device.cast<std::string>());
    const std::optional<Device> before = dtrain::detail::exchange_placement(d);
    return before ? py::object(py::str(before->tf_name())) : py::object(py::none());
  });
  m.def("_set_tensor_float_32", &kernels::set_tensor_float_32_execution, py::arg("enabled"));
  m.def("_tensor_float_32", &kernels::tensor_float_32_execution);
  m.def("_memory_info", [](const std::string& device) {
    const Device d = parse_device(device);
    check_device(d);
    if (d.is_cpu()) throw py::value_error("get_memory_info: '" + device + "' is the CPU; it takes a GPU ('GPU:0')");
    const DeviceMemoryStats s = device_runtime(d.type)->memory_stats(d.index);
    py::dict out;
    out["current"] = s.bytes_in_use;
    out["peak"] = s.peak_bytes_in_use;
    return out;
  });
  // tf.config.set_logical_device_configuration: a physical GPU's name and each logical
  // GPU's memory_limit in MiB (0: none).
  m.def("_set_logical_device_configuration", [](const std::string& gpu, const std::vector<std::size_t>& limits) {
    std::vector<LogicalDeviceConfiguration> logical;
    for (std::size_t mb : limits) logical.push_back({mb});
    set_logical_device_configuration(parse_device(gpu), logical);
  });
  m.def("_logical_device_configuration", [](const std::string& gpu) {
    std::vector<std::size_t> limits;
    for (const LogicalDeviceConfiguration& l : logical_device_configuration(parse_device(gpu)))
      limits.push_back(l.memory_limit_mb);
    return limits;
  });
  m.def("_logical_gpu_count", [] { return logical_gpus().size(); });
  m.def("num_threads", &num_threads);
}

}  // namespace dtrain::python
