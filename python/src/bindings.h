// The dtrain Python module's C++ side (_dtrain): what each binding file defines, and the
// conversions they share. Python's own files (python/dtrain/) give these TensorFlow's names.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include "dtrain/dtrain.h"

namespace dtrain::python {

namespace py = pybind11;

// A tensor from a dtrain Tensor, a numpy array or anything numpy.asarray takes. An array
// already C-contiguous and of the tensor's dtype is shared, not copied (the tensor keeps it
// alive); float64 becomes float32, and the signed integers and bool become int32 (a value
// outside int32 is a ValueError naming `what`), as TensorFlow's Keras converts inputs.
// `dtype` ("float32", "int32", "uint8"; empty: from the data) asks for one dtype.
Tensor to_tensor(py::handle value, const char* what, const std::string& dtype = "");
// The tensor's values as a numpy array sharing its storage (bfloat16: converted to float32).
py::array to_numpy(const Tensor& t);
DType dtype_from_name(const std::string& name, const char* what);
// The iterator's next element as a list of its tensors (advanced without the GIL: its
// threads may need it); StopIteration at the end.
py::list next_components(data::Iterator& it);
// A Python object owned by C++ that may be released on a thread without the GIL.
std::shared_ptr<py::object> hold(py::object object);

// An iterator's threads may be waiting for the GIL (a Python generator or map function):
// it is advanced and stopped without it.
class PyIterator {
 public:
  explicit PyIterator(data::Iterator it) : it_(std::move(it)) {}
  ~PyIterator() {
    py::gil_scoped_release release;
    it_.reset();
  }
  PyIterator(const PyIterator&) = delete;
  PyIterator& operator=(const PyIterator&) = delete;
  // The next element's components; StopIteration at the end.
  py::list next();
  data::Iterator& iterator() { return *it_; }

 private:
  std::optional<data::Iterator> it_;
};

void bind_errors(py::module_& m);
void bind_tensors(py::module_& m);
void bind_keras(py::module_& m);
void bind_own_layers(py::module_& keras);
void bind_data(py::module_& m);
void bind_distribute(py::module_& m);
void bind_train(py::module_& m);

}  // namespace dtrain::python
