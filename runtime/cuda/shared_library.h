// CUDA libraries opened at run time (dlopen) rather than linked: an executable built where CUDA
// is installed then starts anywhere (cpu modules need none of them), and a cuda module on a
// machine without them stops with one line naming the library, not a loader error.
#pragma once
#include <string>
#include <vector>

namespace kiln {

// The first of `names` that dlopen finds (each tried as given: a path, or a name the loader
// searches); throws kiln::Error "cannot load <what> (<names>): <dlerror>" when none is.
void* open_library(const std::vector<std::string>& names, const std::string& what);
// A symbol of a library open_library returned; throws kiln::Error naming it when missing.
void* library_symbol(void* library, const char* symbol, const std::string& what);

// Fills a struct of function pointers, one per line of KILN_API_FUNCTIONS(F): F(name) declares
// `decltype(&::name) name`, looked up by its own name.
#define KILN_API_MEMBER(name) decltype(&::name) name = nullptr;
#define KILN_API_LOAD(name) \
  api.name = reinterpret_cast<decltype(&::name)>(::kiln::library_symbol(library, #name, what));

}  // namespace kiln
