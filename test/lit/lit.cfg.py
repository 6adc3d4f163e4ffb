# lit configuration for Kiln's FileCheck tests (dialects/, passes/, tools/).
import os
import shutil
import lit.formats

config.name = "Kiln"
config.test_format = lit.formats.ShTest(execute_external=True)
config.suffixes = [".mlir", ".toml", ".test"]
config.excludes = ["lit.cfg.py", "lit.site.cfg.py", "Inputs"]
config.test_source_root = os.path.dirname(__file__)
config.test_exec_root = os.path.join(config.kiln_obj_root, "test", "lit")

# Kiln's tools first, then LLVM's (FileCheck, not, count).
config.environment["PATH"] = os.pathsep.join(
    [config.kiln_bin_dir, config.llvm_tools_dir, config.environment.get("PATH", os.environ["PATH"])])
config.substitutions.append(("%kiln_src", config.kiln_src_root))
config.substitutions.append(("%kiln_bin", config.kiln_bin_dir))
config.substitutions.append(("%python", "/usr/bin/python3"))

# kilnc compiles generated CUDA kernels with NVRTC when it was built with CUDA.
if config.kiln_nvrtc.upper() in ("1", "ON", "TRUE", "YES"):
    config.available_features.add("nvrtc")

# Generated CPU kernels multiply bf16 operands with oneDNN when kilnc was built with it.
if config.kiln_dnnl.upper() in ("1", "ON", "TRUE", "YES"):
    config.available_features.add("dnnl")
    # ...which runs them on AVX-512 BF16 or AMX where the CPU has either.
    try:
        flags = next((l.split() for l in open("/proc/cpuinfo") if l.startswith("flags")), [])
    except OSError:
        flags = []
    if "avx512_bf16" in flags or "amx_bf16" in flags:
        config.available_features.add("dnnl-bf16")

# Graphviz's dot draws kiln-inspect --dot graphs (scripts/setup.sh installs it).
if shutil.which("dot", path=config.environment["PATH"]):
    config.available_features.add("graphviz")

# A small tmpfs mounted in a private mount namespace (unshare -rm: no root needed where user
# namespaces are allowed) gives a real file system to fill, for the free-space tests.
import subprocess
try:
    if subprocess.run(["unshare", "-rm", "sh", "-c", "mount -t tmpfs -o size=64k tmpfs /tmp"],
                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=20).returncode == 0:
        config.available_features.add("tmpfs-mount")
except (OSError, subprocess.TimeoutExpired):
    pass

# The host compiler's AddressSanitizer runtime (GCC's libasan; CMake found it), for KILN_CPU_FENCE.
if config.kiln_libasan:
    config.available_features.add("asan")
    config.substitutions.append(("%libasan", config.kiln_libasan))

# mpirun, where the runtime has MPI: %mpirun starts ranks here as test/e2e/test_ranks.py does
# (as root too, more ranks than cores, no CPU binding, no single-copy shared memory).
if getattr(config, "kiln_mpirun", ""):
    config.available_features.add("mpi")
    config.substitutions.append(("%mpirun", config.kiln_mpirun + " --allow-run-as-root --oversubscribe --bind-to none"
                                 " --mca btl_vader_single_copy_mechanism none"))
