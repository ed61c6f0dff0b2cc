// Variable reads and writes.
#include "dtrain/autograd/variable.h"

#include "dtrain/autograd/tape.h"

namespace dtrain {

Variable::Variable(std::string name, Tensor initial_value, bool trainable)
    : name_(std::move(name)), value_(std::move(initial_value)), trainable_(trainable) {
  value_.check_defined("Variable");
}

const Tensor& Variable::value() const {
  if (trainable_) GradientTape::variable_read(value_);
  return value_;
}

void Variable::assign(const Tensor& v) {
  if (!(v.shape() == value_.shape()) || v.dtype() != value_.dtype())
    DTRAIN_THROW(InvalidArgument, "Variable '", name_, "': cannot assign a ", dtype_name(v.dtype()), " ",
                 v.shape().to_string(), " value to a ", dtype_name(value_.dtype()), " ",
                 value_.shape().to_string(), " variable");
  value_.copy_from(v);
}

}  // namespace dtrain
