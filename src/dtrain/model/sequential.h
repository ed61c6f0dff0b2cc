// Sequential: Keras's linear stack of layers, a Model built by add().
#pragma once

#include "dtrain/model/model.h"

namespace dtrain {

class Sequential : public Model {
 public:
  explicit Sequential(std::string name = "sequential") : Model(std::move(name)) {}
  explicit Sequential(std::vector<std::shared_ptr<nn::Layer>> layers, std::string name = "sequential");

  // Appends a layer. A name already used in this model gets a suffix (dense, dense_1, ...).
  void add(std::shared_ptr<nn::Layer> layer);
  template <typename L, typename... Args>
  L& add(Args&&... args) {
    auto layer = std::make_shared<L>(std::forward<Args>(args)...);
    add(layer);
    return *layer;
  }
};

}  // namespace dtrain
