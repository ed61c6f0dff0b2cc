// Keras's whole-model file: Model::save writes it, load_model reads it back into a new
// model, without the code that built the first one. Not a checkpoint of a training run
// (train::Checkpoint, BackupAndRestore): no epoch, no input position.
//
// The file is safetensors with checksums (save_checked), so other frameworks read its
// tensors: every variable by name ("dense/kernel"), every optimizer slot as
// "optimizer/<variable>/<slot>" ("optimizer/dense/kernel/m"). Its __metadata__ holds
//   dtrain.model                 the model's JSON (Model::to_json)
//   dtrain.compile               {"optimizer", "loss", "metrics"} (compile_config.h's forms)
//   dtrain.optimizer_iterations  the optimizer's update count, as decimal text
//   dtrain.layer_rng             {layer name: its random streams}, for layers that have any
// The last three only for a compiled model, the last only where a layer draws at random.
#pragma once

#include <memory>
#include <string>

#include "dtrain/model/sequential.h"

namespace dtrain::models {

// The model `path` holds, built (where the saved one was) and with its weights. With
// `compile` and a compiled model saved, it is compiled with the same optimizer, loss and
// metrics, and the optimizer's slots and iteration count are restored: the next training
// step is the one the saved model would have taken. Made under the strategy whose scope is
// open, as any model is.
// Errors: a file that is not a saved model (a weights-only file from save_weights, a
// checkpoint) is an IoError naming the file and what it lacks; a damaged file, load_checked's
// IoError; a file whose parts do not fit together (a variable missing, a slot of the wrong
// shape), an IoError naming the file and the tensor.
std::unique_ptr<Model> load_model(const std::string& path, bool compile = true);

// Whether a tensor of such a file is an optimizer slot ("optimizer/dense/kernel/m"), which
// the file holds beside the model's variables.
bool is_slot_key(const std::string& name);

}  // namespace dtrain::models
