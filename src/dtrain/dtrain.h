// Everything a dtrain program needs, in one include.
#pragma once

#include "dtrain/autograd/ops.h"
#include "dtrain/autograd/tape.h"
#include "dtrain/autograd/variable.h"
#include "dtrain/core/allocator.h"
#include "dtrain/core/error.h"
#include "dtrain/core/rng.h"
#include "dtrain/core/tensor.h"
#include "dtrain/core/threads.h"
#include "dtrain/losses/losses.h"
#include "dtrain/metrics/metrics.h"
#include "dtrain/nn/layers.h"
#include "dtrain/optim/optimizer.h"
