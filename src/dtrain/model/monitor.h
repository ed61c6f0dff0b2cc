// Which way a logged value improves, for the callbacks that watch one (EarlyStopping,
// ModelCheckpoint): Keras's mode argument. Not a registry of metrics: the name decides.
#pragma once

#include <string>

#include "dtrain/core/error.h"

namespace dtrain {

// Whether larger values of `monitor` are better. mode "max" and "min" say so; "auto" is min
// for names ending in "loss" and max for names with "acc", "auc", "precision" or "recall"
// (val_accuracy, ...), and an InvalidArgument naming `who` and the monitor for any other
// name, rather than a guess that would keep the worst model.
inline bool monitor_maximizes(const std::string& who, const std::string& monitor, const std::string& mode) {
  if (mode == "max") return true;
  if (mode == "min") return false;
  if (mode != "auto") DTRAIN_THROW(InvalidArgument, who, ": mode '", mode, "' is not min, max or auto");
  const auto has = [&](const char* part) { return monitor.find(part) != std::string::npos; };
  if (monitor.size() >= 4 && monitor.compare(monitor.size() - 4, 4, "loss") == 0) return false;
  if (has("acc") || has("auc") || has("precision") || has("recall")) return true;
  DTRAIN_THROW(InvalidArgument, who, ": cannot tell whether '", monitor,
               "' should go up or down; set mode to \"min\" or \"max\"");
}

}  // namespace dtrain
