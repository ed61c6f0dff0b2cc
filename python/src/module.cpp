// The _dtrain extension module: dtrain's C++ API for the Python package around it.
#include "bindings.h"

PYBIND11_MODULE(_dtrain, m) {
  m.doc() = "dtrain's C++ engine; import dtrain for TensorFlow's names";
  dtrain::python::bind_errors(m);
  dtrain::python::bind_tensors(m);
  dtrain::python::bind_keras(m);
  dtrain::python::bind_data(m);
  dtrain::python::bind_distribute(m);
  dtrain::python::bind_train(m);
}
