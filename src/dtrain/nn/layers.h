// The Keras layers: core (Dense, Activation, Dropout, Flatten, Rescaling), convolution,
// pooling, normalization, reshaping, merging, and the transformer's (Embedding,
// MultiHeadAttention, GlobalAveragePooling1D).
#pragma once

#include "dtrain/nn/attention.h"
#include "dtrain/nn/dense.h"
#include "dtrain/nn/activation.h"
#include "dtrain/nn/dropout.h"
#include "dtrain/nn/flatten.h"
#include "dtrain/nn/policy.h"
#include "dtrain/nn/rescaling.h"
#include "dtrain/nn/conv.h"
#include "dtrain/nn/merge.h"
#include "dtrain/nn/normalization.h"
#include "dtrain/nn/pooling.h"
#include "dtrain/nn/preprocessing.h"
#include "dtrain/nn/reshaping.h"
