// What compile() takes, as JSON: an optimizer with its learning-rate schedule, and a loss.
// The dtrain command's config and a saved model (model.save) use this one form. Only
// dtrain's built-in optimizers, losses and schedules have one; this is not a registry
// of user classes.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "dtrain/losses/losses.h"
#include "dtrain/optim/optimizer.h"
#include "dtrain/optim/schedules.h"

namespace dtrain {

// Every reader is strict (unknown keys are errors) and throws InvalidArgument whose message
// starts with the JSON path of the offending key, `path` first ("optimizer.momentum: SGD:
// momentum must be in [0, 1], got -1"); a check made by the object's constructor is
// reported at the key it names.

// A learning rate: a number (Constant), or {"class_name": "ExponentialDecay" |
// "CosineDecay" | "PiecewiseConstantDecay" | "LinearWarmup", "config": {...}}.
std::shared_ptr<optim::LearningRateSchedule> schedule_from_json(const nlohmann::json& value, const std::string& path);

// "sgd", "adam", "adamw", "rmsprop", "adagrad" (Keras's defaults), or {"name",
// "learning_rate", "momentum", "nesterov" (sgd), "beta_1", "beta_2", "epsilon" (adam,
// adamw), "rho", "momentum", "epsilon", "centered" (rmsprop), "initial_accumulator_value",
// "epsilon" (adagrad), "weight_decay", "clipnorm", "global_clipnorm"}.
std::shared_ptr<optim::Optimizer> optimizer_from_json(const nlohmann::json& value, const std::string& path);

// "sparse_categorical_crossentropy", "categorical_crossentropy", "mse" /
// "mean_squared_error", or {"name", "from_logits", "label_smoothing" (categorical),
// "reduction"}.
std::shared_ptr<losses::Loss> loss_from_json(const nlohmann::json& value, const std::string& path);

// The inverses: JSON the readers above turn back into an equal object (every float exactly
// as it was). An optimizer, loss or schedule of a class they do not know (a user's own) is
// an InvalidArgument naming it.
nlohmann::json schedule_to_json(const optim::LearningRateSchedule& schedule);
nlohmann::json optimizer_to_json(const optim::Optimizer& optimizer);
nlohmann::json loss_to_json(const losses::Loss& loss);

}  // namespace dtrain
