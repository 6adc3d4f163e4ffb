// dlopen and dlsym with kiln::Error messages (see shared_library.h).
#include "runtime/cuda/shared_library.h"

#include <dlfcn.h>

#include "runtime/error.h"

namespace kiln {

void* open_library(const std::vector<std::string>& names, const std::string& what) {
  std::string tried, last;
  for (const std::string& name : names) {
    if (void* h = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL)) return h;
    const char* e = dlerror();
    last = e ? e : "not found";
    tried += (tried.empty() ? "" : ", ") + name;
  }
  throw Error("cannot load " + what + " (tried " + tried + "): " + last);
}

void* library_symbol(void* library, const char* symbol, const std::string& what) {
  void* f = dlsym(library, symbol);
  if (!f) throw Error(what + " has no " + symbol + " (a library older than this runtime was built for?)");
  return f;
}

}  // namespace kiln
