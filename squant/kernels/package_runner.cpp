// Runs an AOTInductor package with the GIL released, its weights 64-byte aligned.
//
// torch's Python binding of a package (torch._inductor.package.load_package) keeps the GIL
// for the whole forward: a Python thread beside a serving thread ran at 2% of its speed, and
// two serving threads on one package took turns. Called through the dispatcher
// (torch.ops.squant.run_package), the call releases the GIL like any eager op, so two
// threads run one package at once (each on one of its runners) while the event loop and the
// tokenizer keep going.
//
// AOTInductor's CPU runtime copies a package's constants into one block from std::malloc,
// 64-byte aligned offsets within it, but the block itself only 16-byte aligned (glibc puts a
// large block 16 bytes past a page start): every weight started 16 bytes into a cache line,
// so each 64-byte row of a packed weight block spanned two lines, and squant's int8 GEMMs ran
// ~1.6x slower from a package than in the compiled model (distilbert 1 x 256, 2 threads, AMX
// Xeon). At load, each constant is copied once into its own tensor (PyTorch's CPU allocator
// aligns to 64 bytes), those are handed to the runtime as its constants (kept here, not
// copied again), and the runtime's block is freed: one copy of the weights, aligned.

#include <ATen/ATen.h>
#include <torch/csrc/inductor/aoti_package/model_package_loader.h>
#include <torch/library.h>

#include "internal.h"

#include <algorithm>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace squant_package {
namespace {

using Loader = torch::inductor::AOTIModelPackageLoader;

// A loaded package and the constants it runs on when squant realigned them (the runtime holds
// pointers to these tensors: they live as long as the loader, and are destroyed after it).
struct Package {
  std::vector<at::Tensor> constants;
  std::unique_ptr<Loader> loader;
};

std::mutex registry_lock;
std::vector<std::shared_ptr<Package>>& registry() {
  // never destroyed: at process exit a static registry's destructor would free loaders after
  // libtorch's own statics are gone (a segfault after the test suite had passed)
  static auto* packages = new std::vector<std::shared_ptr<Package>>();
  return *packages;
}

std::shared_ptr<Package> find(int64_t handle) {
  std::lock_guard<std::mutex> guard(registry_lock);
  auto& packages = registry();
  TORCH_CHECK(handle >= 0 && handle < static_cast<int64_t>(packages.size()) && packages[handle],
              "squant: no loaded package with handle ", handle);
  return packages[handle];
}

// Whether a constant is a plain tensor in memory (not an opaque one, e.g. a oneDNN-packed weight).
bool in_memory(const at::Tensor& t) {
  return t.defined() && t.has_storage() && t.numel() > 0;
}

bool aligned(const at::Tensor& t) {
  if (!in_memory(t)) return true;  // an opaque tensor has no data pointer to ask
  return reinterpret_cast<uintptr_t>(t.data_ptr()) % squant_kernels::kCacheLine == 0;
}

// The runtime's constants moved to 64-byte aligned tensors (see the top of this file); a
// no-op where they all are aligned already.
void realign_constants(Package& package) {
  auto* runner = package.loader->get_runner();
  const auto by_fqn = runner->extract_constants_map(/*use_inactive=*/false);
  if (std::all_of(by_fqn.begin(), by_fqn.end(), [](const auto& kv) { return aligned(kv.second); }))
    return;
  const auto fqn_of = runner->getConstantNamesToOriginalFQNs();  // runtime name -> fqn
  // sized up front: the runtime keeps pointers to these elements
  package.constants.reserve(fqn_of.size());
  torch::inductor::TensorConstantMap by_name;
  for (const auto& [name, fqn] : fqn_of) {
    const auto it = by_fqn.find(fqn);
    if (it == by_fqn.end()) continue;  // folded at compile time: not a loaded constant
    const at::Tensor& t = it->second;
    // an opaque constant (a oneDNN-packed float weight) also points into the runtime's block:
    // cloned into memory of its own, so that the block can go
    package.constants.push_back(
        in_memory(t) ? at::empty_strided(t.sizes(), t.strides(), t.options()).copy_(t)
                     : t.clone());
    by_name.emplace(name, &package.constants.back());
  }
  // into the inactive set, made active, the runtime's own block freed with the old set
  runner->update_constant_buffer(by_name, /*use_inactive=*/true, /*validate_full_updates=*/true,
                                 /*user_managed=*/true);
  runner->swap_constant_buffer();
  runner->free_inactive_constant_buffer();
}

// A handle to the package at `path` with `num_runners` runners (calls that may run at once;
// they share one copy of the weights).
int64_t load_package(const std::string& path, int64_t num_runners) {
  TORCH_CHECK(num_runners >= 1, "squant: num_runners must be >= 1, got ", num_runners);
  auto package = std::make_shared<Package>();
  package->loader =
      std::make_unique<Loader>(path, "model", false, static_cast<size_t>(num_runners));
  realign_constants(*package);
  std::lock_guard<std::mutex> guard(registry_lock);
  registry().push_back(std::move(package));
  return static_cast<int64_t>(registry().size()) - 1;
}

std::vector<at::Tensor> run_package(int64_t handle, std::vector<at::Tensor> inputs) {
  // the shared_ptr keeps the package alive even if free_package runs meanwhile
  std::shared_ptr<Package> package = find(handle);
  return package->loader->run(inputs);
}

// The largest power of two up to 64 that divides the address of every constant the package
// runs on (64 once load_package realigned them).
int64_t package_constant_alignment(int64_t handle) {
  const std::shared_ptr<Package> package = find(handle);
  uintptr_t bits = squant_kernels::kCacheLine;
  for (const auto& kv : package->loader->get_runner()->extract_constants_map(false)) {
    if (!in_memory(kv.second)) continue;
    bits |= reinterpret_cast<uintptr_t>(kv.second.data_ptr());
  }
  return static_cast<int64_t>(bits & (~bits + 1));  // lowest set bit
}

void free_package(int64_t handle) {
  std::shared_ptr<Package> package;
  {
    std::lock_guard<std::mutex> guard(registry_lock);
    auto& packages = registry();
    if (handle < 0 || handle >= static_cast<int64_t>(packages.size())) return;
    package.swap(packages[handle]);
  }
  // destroyed here, outside the lock (the loader removes its extracted files)
}

}  // namespace
}  // namespace squant_package

TORCH_LIBRARY_FRAGMENT(squant, m) {
  m.def("load_package(str path, int num_runners) -> int", &squant_package::load_package);
  m.def("run_package(int handle, Tensor[] inputs) -> Tensor[]", &squant_package::run_package);
  m.def("package_constant_alignment(int handle) -> int",
        &squant_package::package_constant_alignment);
  m.def("free_package(int handle) -> ()", &squant_package::free_package);
}
