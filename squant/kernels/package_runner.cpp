// Runs an AOTInductor package with the GIL released.
//
// torch's Python binding of a package (torch._inductor.package.load_package) keeps the GIL
// for the whole forward: a Python thread beside a serving thread ran at 2% of its speed, and
// two serving threads on one package took turns. Called through the dispatcher
// (torch.ops.squant.run_package), the call releases the GIL like any eager op, so two
// threads run one package at once (each on one of its runners) while the event loop and the
// tokenizer keep going.

#include <torch/csrc/inductor/aoti_package/model_package_loader.h>
#include <torch/library.h>

#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace squant_package {
namespace {

using Loader = torch::inductor::AOTIModelPackageLoader;

std::mutex registry_lock;
std::vector<std::shared_ptr<Loader>>& registry() {
  // never destroyed: at process exit a static registry's destructor would free loaders after
  // libtorch's own statics are gone (a segfault after the test suite had passed)
  static auto* loaders = new std::vector<std::shared_ptr<Loader>>();
  return *loaders;
}

std::shared_ptr<Loader> find(int64_t handle) {
  std::lock_guard<std::mutex> guard(registry_lock);
  auto& loaders = registry();
  TORCH_CHECK(handle >= 0 && handle < static_cast<int64_t>(loaders.size()) && loaders[handle],
              "squant: no loaded package with handle ", handle);
  return loaders[handle];
}

// A handle to the package at `path` with `num_runners` runners (calls that may run at once;
// they share one copy of the weights).
int64_t load_package(const std::string& path, int64_t num_runners) {
  TORCH_CHECK(num_runners >= 1, "squant: num_runners must be >= 1, got ", num_runners);
  auto loader = std::make_shared<Loader>(path, "model", false, static_cast<size_t>(num_runners));
  std::lock_guard<std::mutex> guard(registry_lock);
  registry().push_back(std::move(loader));
  return static_cast<int64_t>(registry().size()) - 1;
}

std::vector<at::Tensor> run_package(int64_t handle, std::vector<at::Tensor> inputs) {
  // the shared_ptr keeps the loader alive even if free_package runs meanwhile
  std::shared_ptr<Loader> loader = find(handle);
  return loader->run(inputs);
}

void free_package(int64_t handle) {
  std::shared_ptr<Loader> loader;
  {
    std::lock_guard<std::mutex> guard(registry_lock);
    auto& loaders = registry();
    if (handle < 0 || handle >= static_cast<int64_t>(loaders.size())) return;
    loader.swap(loaders[handle]);
  }
  // destroyed here, outside the lock (it removes its extracted files)
}

}  // namespace
}  // namespace squant_package

TORCH_LIBRARY_FRAGMENT(squant, m) {
  m.def("load_package(str path, int num_runners) -> int", &squant_package::load_package);
  m.def("run_package(int handle, Tensor[] inputs) -> Tensor[]", &squant_package::run_package);
  m.def("free_package(int handle) -> ()", &squant_package::free_package);
}
