// Checkpoint: gathering the tracked objects' state into one file and putting it back.
#include "dtrain/checkpoint/checkpoint.h"

#include <cstring>
#include <filesystem>
#include <map>
#include <set>

#include "dtrain/core/error.h"
#include "dtrain/core/threads.h"

namespace dtrain::train {
namespace {

constexpr const char* kStateKey = "dtrain.state";
constexpr const char* kFormat = "dtrain.checkpoint";
constexpr int kVersion = 1;

template <class... Ts>
struct Overloaded : Ts... {
  using Ts::operator()...;
};
template <class... Ts>
Overloaded(Ts...) -> Overloaded<Ts...>;

std::vector<const Model*> models_of(const std::vector<std::pair<std::string, Trackable>>& objects) {
  std::vector<const Model*> out;
  for (const auto& [name, t] : objects)
    if (const auto* m = std::get_if<Model*>(&t.object())) out.push_back(*m);
  return out;
}

std::string slot_key(const std::string& name, const Variable& v, const std::string& slot) {
  return name + "/" + v.name() + "/" + slot;
}

// Every worker's `mine`, in worker order (a collective: every worker calls it at the same
// point). Values travel as three 22-bit pieces, each a double that a sum carries exactly
// when one worker alone fills its slot.
std::vector<std::vector<std::uint64_t>> gather_over_workers(StrategyBackend& strategy,
                                                            const std::vector<std::uint64_t>& mine) {
  const auto n = static_cast<std::size_t>(strategy.num_workers());
  const auto me = static_cast<std::size_t>(strategy.worker_index());
  std::vector<double> sizes(n, 0.0);
  sizes[me] = static_cast<double>(mine.size());
  strategy.sum_over_workers(sizes);
  std::vector<std::size_t> offset(n + 1, 0);
  for (std::size_t w = 0; w < n; ++w) offset[w + 1] = offset[w] + static_cast<std::size_t>(sizes[w]);
  std::vector<double> all(3 * offset[n], 0.0);
  for (std::size_t i = 0; i < mine.size(); ++i)
    for (std::size_t k = 0; k < 3; ++k)
      all[3 * (offset[me] + i) + k] = static_cast<double>((mine[i] >> (22 * k)) & 0x3fffff);
  strategy.sum_over_workers(all);
  std::vector<std::vector<std::uint64_t>> out(n);
  for (std::size_t w = 0; w < n; ++w)
    for (std::size_t i = offset[w]; i < offset[w + 1]; ++i) {
      std::uint64_t v = 0;
      for (std::size_t k = 0; k < 3; ++k) v |= static_cast<std::uint64_t>(all[3 * i + k]) << (22 * k);
      out[w].push_back(v);
    }
  return out;
}

}  // namespace

const RestoreStatus& RestoreStatus::assert_consumed() const {
  if (unused_.empty()) return *this;
  std::string list;
  for (std::size_t i = 0; i < unused_.size() && i < 8; ++i) list += (i ? ", '" : "'") + unused_[i] + "'";
  if (unused_.size() > 8) list += ", ...";
  DTRAIN_THROW(InvalidArgument, path_, ": ", unused_.size(), " entries were not restored into anything (", list,
               "); the checkpoint tracks objects this program does not");
}

Checkpoint::Checkpoint(std::initializer_list<std::pair<std::string, Trackable>> objects)
    : Checkpoint(std::vector<std::pair<std::string, Trackable>>(objects)) {}

Checkpoint::Checkpoint(std::vector<std::pair<std::string, Trackable>> objects) : objects_(std::move(objects)) {
  std::set<std::string> names;
  for (const auto& [name, t] : objects_) {
    if (name.empty() || name.find('/') != std::string::npos || name.rfind("dtrain.", 0) == 0)
      DTRAIN_THROW(InvalidArgument, "Checkpoint: the name '", name, "' must be non-empty, without '/', and not start with 'dtrain.'");
    if (!names.insert(name).second) DTRAIN_THROW(InvalidArgument, "Checkpoint: the name '", name, "' is used twice");
  }
}

StrategyBackend* Checkpoint::multi_worker() const {
  for (const Model* m : models_of(objects_))
    if (m->distribute_strategy() && m->distribute_strategy()->num_workers() > 1) return m->distribute_strategy().get();
  return nullptr;
}

NamedTensors Checkpoint::capture() const {
  NamedTensors out;
  // Values on a GPU are saved from host copies: a checkpoint does not depend on the device.
  auto add = [&](std::string key, const Tensor& t) { out.tensors.emplace_back(std::move(key), t.to(Device::cpu())); };
  const std::vector<const Model*> models = models_of(objects_);
  StrategyBackend* workers = worker_local_ ? nullptr : multi_worker();
  nlohmann::json state = nlohmann::json::object();
  state["format"] = kFormat;
  state["version"] = kVersion;
  state["save_counter"] = save_counter_;
  const SeedSequence seeds = seed_sequence();
  state["seed_sequence"] = {seeds.seed, seeds.drawn};
  nlohmann::json& objects = state["objects"] = nlohmann::json::object();
  for (const auto& [name, trackable] : objects_) {
    nlohmann::json& o = objects[name];
    std::visit(Overloaded{
                   [&](Model* m) {
                     o["kind"] = "model";
                     o["name"] = m->name();
                     // What a model not yet built when restored is built for (TensorFlow
                     // restores such a model's weights when it is built).
                     if (m->input_shape()) o["input_shape"] = m->input_shape()->to_vector();
                     nlohmann::json& rng = o["rng"] = nlohmann::json::object();
                     if (!workers) {
                       for (const auto& layer : m->layers()) {
                         const std::vector<std::uint64_t> r = layer->rng_state();
                         if (!r.empty()) rng[layer->name()] = r;
                       }
                     } else {
                       // Each worker's replicas draw from random streams of their own
                       // (Dropout's masks), so the file holds every worker's, gathered, as
                       // rng[layer][worker], and each worker restores its own.
                       std::vector<std::uint64_t> mine;
                       for (const auto& layer : m->layers()) {
                         const std::vector<std::uint64_t> r = layer->rng_state();
                         mine.push_back(r.size());
                         mine.insert(mine.end(), r.begin(), r.end());
                       }
                       const std::vector<std::vector<std::uint64_t>> all = gather_over_workers(*workers, mine);
                       o["rng_workers"] = all.size();
                       for (const std::vector<std::uint64_t>& theirs : all) {
                         std::size_t at = 0;
                         for (const auto& layer : m->layers()) {
                           DTRAIN_CHECK(at < theirs.size(), "a worker's random-stream state is shorter than its layers");
                           const auto size = static_cast<std::size_t>(theirs[at++]);
                           DTRAIN_CHECK(at + size <= theirs.size(), "a worker's random-stream state is cut short");
                           if (size > 0)
                             rng[layer->name()].push_back(std::vector<std::uint64_t>(
                                 theirs.begin() + static_cast<std::ptrdiff_t>(at),
                                 theirs.begin() + static_cast<std::ptrdiff_t>(at + size)));
                           at += size;
                         }
                       }
                     }
                     for (Variable* v : m->variables()) add(name + "/" + v->name(), v->value());
                   },
                   [&](optim::Optimizer* opt) {
                     o["kind"] = "optimizer";
                     o["class"] = opt->name();
                     o["iterations"] = opt->iterations();
                     if (const auto& ls = opt->loss_scale_options())
                       o["loss_scale"] = {{"scale", opt->loss_scale()},
                                          {"good_steps", opt->loss_scale_good_steps()},
                                          {"dynamic", ls->dynamic},
                                          {"initial_scale", ls->initial_scale},
                                          {"dynamic_growth_steps", ls->dynamic_growth_steps}};
                     for (const Model* m : models)
                       for (Variable* v : m->variables())
                         for (const auto& [slot, t] : opt->slots(*v)) add(slot_key(name, *v, slot), *t);
                   },
                   [&](data::Iterator* it) {
                     o["kind"] = "iterator";
                     const std::string bytes = it->save().to_bytes();
                     Tensor t = Tensor::empty(Shape{static_cast<std::int64_t>(bytes.size())}, DType::u8);
                     std::memcpy(t.raw_data(), bytes.data(), bytes.size());
                     add(name, t);
                   },
                   [&](Variable* v) {
                     o["kind"] = "variable";
                     add(name, v->value());
                   },
                   [&](Generator* g) {
                     o["kind"] = "generator";
                     o["state"] = {g->seed(), g->counter()};
                   },
                   [&](std::int64_t* value) {
                     o["kind"] = "integer";
                     o["value"] = *value;
                   },
                   [&](const JsonState& js) {
                     o["kind"] = "json";
                     o["value"] = js.save ? js.save() : nlohmann::json();
                   },
               },
               trackable.object());
  }
  out.metadata[kStateKey] = state.dump();
  return out;
}

std::uint64_t digest_of(Snapshot& snapshot) {
  add_checksums(snapshot);
  const NamedTensors& data = snapshot.data;
  // Input positions belong to each worker (its shard), and so may random streams (a
  // worker's own, not gathered): they are not compared.
  nlohmann::json state = nlohmann::json::parse(data.metadata.at(kStateKey));
  std::set<std::string> iterators;
  for (auto& [name, o] : state["objects"].items()) {
    if (o["kind"] == "iterator") iterators.insert(name);
    if (o["kind"] == "model") o.erase("rng");
  }
  std::uint64_t h = fnv1a(state.dump());
  for (std::size_t i = 0; i < data.tensors.size(); ++i) {
    const std::string& name = data.tensors[i].first;
    if (iterators.count(name)) continue;
    h = mix64(h ^ fnv1a(name)) ^ snapshot.checksums[i];
  }
  return h;
}

void Checkpoint::snapshot(Snapshot& into, bool copy) const {
  if (copy) {
    pack(capture(), into);
  } else {
    into = Snapshot{capture()};
  }
}

void Checkpoint::write_snapshot(Snapshot& snapshot, const std::string& path, bool sync_folder) {
  // As TensorFlow does, save("dir/ckpt") makes dir.
  if (const std::filesystem::path parent = std::filesystem::path(path).parent_path(); !parent.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(parent, ec);
    if (ec || !std::filesystem::is_directory(parent))
      DTRAIN_THROW(IoError, path, ": cannot make its folder ", parent.string(), " (",
                   ec ? ec.message() : "not a folder", ")");
  }
  add_checksums(snapshot);
  save_checked(path, snapshot, sync_folder);
}

std::string Checkpoint::save(const std::string& prefix) {
  ++save_counter_;
  return write(prefix + "-" + std::to_string(save_counter_) + ".safetensors");
}

std::string Checkpoint::write(const std::string& path) {
  Snapshot live;
  snapshot(live, /*copy=*/false);
  StrategyBackend* workers = multi_worker();
  if (!workers || workers->worker_index() == 0) write_snapshot(live, path);
  if (workers) check_same_state_on_every_worker(*workers, digest_of(live), "checkpoint " + path);
  return path;
}

void check_same_state_on_every_worker(StrategyBackend& strategy, std::uint64_t digest, const std::string& what) {
  const std::vector<std::vector<std::uint64_t>> all = gather_over_workers(strategy, {digest});
  std::string differ;
  for (std::size_t w = 1; w < all.size(); ++w)
    if (all[w] != all[0]) differ += (differ.empty() ? "" : ", ") + std::to_string(w);
  if (!differ.empty())
    DTRAIN_THROW(PeerFailure, what, ": worker(s) ", differ, " hold different state from the chief (worker 0); ",
                 "the workers are no longer training the same model");
}

RestoreStatus Checkpoint::restore(const std::string& path, RestoreOptions options) {
  return restore_from(load_checked(path), path, options);
}

RestoreStatus Checkpoint::restore(const Snapshot& snapshot, const std::string& where, RestoreOptions options) {
  if (snapshot.checksums.size() != snapshot.data.tensors.size())
    DTRAIN_THROW(InvalidArgument, where, ": a snapshot without its checksums (take it with snapshot(into), which copies)");
  // Checked on the compute threads, as pack() computed them; the first changed tensor named.
  const std::size_t n = snapshot.data.tensors.size();
  std::vector<char> changed(n, 0);
  parallel_for(static_cast<std::int64_t>(n), 1, [&](std::int64_t b, std::int64_t e) {
    for (auto i = static_cast<std::size_t>(b); i < static_cast<std::size_t>(e); ++i)
      changed[i] = tensor_checksum(snapshot.data.tensors[i].second) != snapshot.checksums[i];
  });
  for (std::size_t i = 0; i < n; ++i)
    if (changed[i])
      DTRAIN_THROW(IoError, where, ": tensor '", snapshot.data.tensors[i].first,
                   "' changed in memory since it was taken (its checksum differs)");
  return restore_from(snapshot.data, where, options);
}

RestoreStatus Checkpoint::restore_from(const NamedTensors& data, const std::string& path, RestoreOptions options) {
  const auto state_text = data.metadata.find(kStateKey);
  if (state_text == data.metadata.end())
    DTRAIN_THROW(IoError, path, ": has no ", kStateKey, " in its metadata: a safetensors file, but not a dtrain checkpoint");
  nlohmann::json state;
  try {
    state = nlohmann::json::parse(state_text->second);
  } catch (const nlohmann::json::exception& e) {
    DTRAIN_THROW(IoError, path, ": ", kStateKey, " is not JSON: ", e.what());
  }
  if (!state.is_object() || state.value("format", "") != kFormat || !state.contains("objects") ||
      !state["objects"].is_object())
    DTRAIN_THROW(IoError, path, ": ", kStateKey, " is not a dtrain checkpoint's state");
  if (state.value("version", 0) != kVersion)
    DTRAIN_THROW(IoError, path, ": written by checkpoint format version ", state.value("version", 0),
                 "; this dtrain reads version ", kVersion);
  std::map<std::string, const Tensor*> tensors;
  for (const auto& [k, t] : data.tensors) tensors[k] = &t;
  std::set<std::string> taken;
  const nlohmann::json& objects = state["objects"];
  const std::vector<const Model*> models = models_of(objects_);

  // A model not built yet is built as it was when saved, so that its weights can be restored.
  for (const auto& [name, trackable] : objects_) {
    Model* const* model = std::get_if<Model*>(&trackable.object());
    if (!model || (*model)->built()) continue;
    const nlohmann::json& o = objects.contains(name) ? objects[name] : nlohmann::json();
    if (!o.is_object() || !o.contains("input_shape") || !o["input_shape"].is_array())
      DTRAIN_THROW(InvalidArgument, path, ": model '", (*model)->name(), "' (tracked as '", name,
                   "') is not built and the file does not say its input shape; build it (model.build(input_shape) or "
                   "one call) before restoring");
    (*model)->build(Shape(o["input_shape"].get<std::vector<std::int64_t>>()));
  }

  // Pass 1 checks, pass 2 applies: nothing changes unless everything fits.
  std::vector<std::function<void()>> apply;
  auto tensor_for = [&](const std::string& key, const Shape& shape, DType dtype, const std::string& who) -> const Tensor* {
    auto it = tensors.find(key);
    if (it == tensors.end()) {
      if (options.partial) return nullptr;
      DTRAIN_THROW(IoError, path, ": has no tensor '", key, "' for ", who,
                   "; is this another model's checkpoint? (RestoreOptions::partial keeps what is missing)");
    }
    if (!(it->second->shape() == shape) || it->second->dtype() != dtype)
      DTRAIN_THROW(IoError, path, ": tensor '", key, "' is ", dtype_name(it->second->dtype()), " ",
                   it->second->shape().to_string(), ", but ", who, " needs ", dtype_name(dtype), " ", shape.to_string());
    taken.insert(key);
    return it->second;
  };
  auto object_for = [&](const std::string& name, const char* kind) -> const nlohmann::json* {
    if (!objects.contains(name)) {
      if (options.partial) return nullptr;
      DTRAIN_THROW(IoError, path, ": tracks no object '", name, "' (it has: ", [&] {
        std::string s;
        for (auto& [k, v] : objects.items()) s += (s.empty() ? "" : ", ") + k;
        return s;
      }(), ")");
    }
    const nlohmann::json& o = objects[name];
    if (!o.is_object() || o.value("kind", "") != kind)
      DTRAIN_THROW(IoError, path, ": object '", name, "' is a ", o.is_object() ? o.value("kind", "?") : "?",
                   " in the file, but this program tracks a ", kind, " under that name");
    return &o;
  };
  try {
    for (const auto& [name, trackable] : objects_) {
      std::visit(
          Overloaded{
              [&](Model* m) {
                const nlohmann::json* o = object_for(name, "model");
                for (Variable* v : m->variables()) {
                  const Tensor* t = tensor_for(name + "/" + v->name(), v->shape(), v->dtype(),
                                               "model '" + m->name() + "' variable '" + v->name() + "'");
                  if (t) apply.push_back([v, t] { v->assign(*t); });
                }
                if (!o) return;
                const nlohmann::json& rng = (*o)["rng"];
                // Written by several workers: rng[layer][worker], each worker's own streams.
                const int workers_now = m->distribute_strategy() ? m->distribute_strategy()->num_workers() : 1;
                const int me = m->distribute_strategy() ? m->distribute_strategy()->worker_index() : 0;
                const bool per_worker = o->contains("rng_workers");
                if (per_worker && (*o)["rng_workers"].get<int>() != workers_now)
                  DTRAIN_THROW(InvalidArgument, path, ": the random streams of model '", m->name(), "' were saved by ",
                               (*o)["rng_workers"].get<int>(), " workers, one set each, and this job has ", workers_now,
                               "; restore it into as many workers as saved it");
                for (const auto& layer : m->layers()) {
                  nn::Layer* l = layer.get();
                  if (rng.is_object() && rng.contains(l->name())) {
                    auto values = (per_worker ? rng[l->name()].at(static_cast<std::size_t>(me)) : rng[l->name()])
                                      .get<std::vector<std::uint64_t>>();
                    apply.push_back([l, values] { l->set_rng_state(values); });
                  } else if (!l->rng_state().empty() && !options.partial) {
                    DTRAIN_THROW(IoError, path, ": has no random-stream state for layer '", l->name(), "' of model '",
                                 m->name(), "'");
                  }
                }
              },
              [&](optim::Optimizer* opt) {
                const nlohmann::json* o = object_for(name, "optimizer");
                if (!o) return;
                if ((*o).value("class", "") != opt->name())
                  DTRAIN_THROW(IoError, path, ": optimizer '", name, "' is ", (*o).value("class", "?"),
                               " in the file, but this program's is ", opt->name());
                const std::int64_t iterations = (*o).at("iterations").get<std::int64_t>();
                apply.push_back([opt, iterations] { opt->set_iterations(iterations); });
                if (o->contains("loss_scale")) {
                  // The scale, its count and its settings: an optimizer restored before compile
                  // (which would add them under mixed_float16) gets them here, and keeps them.
                  const nlohmann::json& s = (*o)["loss_scale"];
                  // The settings may be missing (Keras's then).
                  const bool well_formed =
                      s.is_object() && s.contains("scale") && s["scale"].is_number() && s.contains("good_steps") &&
                      s["good_steps"].is_number_integer() && (!s.contains("dynamic") || s["dynamic"].is_boolean()) &&
                      (!s.contains("initial_scale") || s["initial_scale"].is_number()) &&
                      (!s.contains("dynamic_growth_steps") || s["dynamic_growth_steps"].is_number_integer());
                  if (!well_formed)
                    DTRAIN_THROW(IoError, path, ": optimizer '", name, "' has a malformed loss_scale: ", s.dump());
                  const float scale = s["scale"].get<float>();
                  const auto good = s["good_steps"].get<std::int64_t>();
                  const optim::LossScale keras;
                  const optim::LossScale settings{s.value("dynamic", keras.dynamic), s.value("initial_scale", keras.initial_scale),
                                                  s.value("dynamic_growth_steps", keras.dynamic_growth_steps)};
                  try {
                    optim::check_loss_scale(settings, scale, good);
                  } catch (const InvalidArgument& e) {
                    DTRAIN_THROW(IoError, path, ": optimizer '", name, "': ", e.what());
                  }
                  apply.push_back([opt, scale, good, settings] {
                    if (!opt->loss_scale_options()) opt->set_loss_scale(settings);
                    opt->set_loss_scale_state(scale, good);
                  });
                }
                const std::vector<std::string> slot_names = opt->slot_names_in_order();
                for (const Model* m : models)
                  for (Variable* v : m->variables()) {
                    // A variable never updated has no slots in the file; it starts from zeros.
                    if (!tensors.count(slot_key(name, *v, slot_names.empty() ? "" : slot_names[0]))) continue;
                    std::vector<const Tensor*> found;
                    for (const std::string& s : slot_names)
                      found.push_back(tensor_for(slot_key(name, *v, s), v->shape(), DType::f32,
                                                 "slot '" + s + "' of variable '" + v->name() + "'"));
                    apply.push_back([opt, v, found] {
                      auto slots = opt->slots(*v, /*create=*/true);
                      for (std::size_t i = 0; i < slots.size() && i < found.size(); ++i)
                        if (found[i]) slots[i].second->copy_from(*found[i]);
                    });
                  }
              },
              [&](data::Iterator* it) {
                if (!object_for(name, "iterator")) return;
                auto t = tensors.find(name);
                if (t == tensors.end() || t->second->dtype() != DType::u8)
                  DTRAIN_THROW(IoError, path, ": iterator '", name, "' has no U8 state tensor");
                taken.insert(name);
                const Tensor* bytes = t->second;
                auto restored = std::make_shared<data::IteratorState>(data::IteratorState::from_bytes(
                    std::string_view(static_cast<const char*>(bytes->raw_data()), static_cast<std::size_t>(bytes->nbytes()))));
                apply.push_back([it, restored] { it->restore(*restored); });
              },
              [&](Variable* v) {
                if (!object_for(name, "variable")) return;
                const Tensor* t = tensor_for(name, v->shape(), v->dtype(), "variable '" + v->name() + "'");
                if (t) apply.push_back([v, t] { v->assign(*t); });
              },
              [&](Generator* g) {
                const nlohmann::json* o = object_for(name, "generator");
                if (!o) return;
                const auto s = (*o).at("state").get<std::vector<std::uint64_t>>();
                if (s.size() != 2) DTRAIN_THROW(IoError, path, ": generator '", name, "' state is not [seed, counter]");
                apply.push_back([g, s] { *g = Generator(s[0], s[1]); });
              },
              [&](std::int64_t* value) {
                const nlohmann::json* o = object_for(name, "integer");
                if (!o) return;
                const std::int64_t v = (*o).at("value").get<std::int64_t>();
                apply.push_back([value, v] { *value = v; });
              },
              [&](const JsonState& js) {
                const nlohmann::json* o = object_for(name, "json");
                if (!o || !js.restore) return;
                nlohmann::json v = (*o).at("value");
                if (js.check) js.check(v);
                apply.push_back([&js, v] { js.restore(v); });
              },
          },
          trackable.object());
    }
  } catch (const nlohmann::json::exception& e) {
    DTRAIN_THROW(IoError, path, ": ", kStateKey, " is malformed: ", e.what());
  }
  for (auto& f : apply) f();
  const auto& seq = state["seed_sequence"];
  if (seq.is_array() && seq.size() == 2)
    set_seed_sequence({seq[0].get<std::uint64_t>(), seq[1].get<std::uint64_t>()});
  save_counter_ = state.value("save_counter", save_counter_);
  std::vector<std::string> unused;
  for (const auto& [k, t] : data.tensors)
    if (!taken.count(k)) unused.push_back(k);
  for (auto& [k, v] : objects.items()) {
    bool tracked = false;
    for (const auto& [name, t] : objects_) tracked = tracked || name == k;
    if (!tracked) unused.push_back(k);
  }
  return RestoreStatus(path, std::move(unused));
}

}  // namespace dtrain::train
