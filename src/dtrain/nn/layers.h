// The core Keras layers: Dense, Activation, Dropout, Flatten, Rescaling.
#pragma once

#include "dtrain/nn/dense.h"
#include "dtrain/nn/activation.h"
#include "dtrain/nn/dropout.h"
#include "dtrain/nn/flatten.h"
#include "dtrain/nn/policy.h"
#include "dtrain/nn/rescaling.h"
