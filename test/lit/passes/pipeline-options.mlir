// kiln-opt's pipelines are kilnc's stages: what the spec decides comes from the module's
// kiln.spec (bf16 runs kiln-mixed-precision first; target "cuda" gives every op a generated
// kernel), kilnc's flags are options, and the IR is kilnc's. Unknown options and bad values are
// errors, not ignored.
// RUN: rm -rf %t && mkdir %t && cd %t
// RUN: sed 's/precision = "fp32"/precision = "bf16"/' %kiln_src/models/gpt2-tiny.toml > tiny-bf16.toml
// RUN: kilnc tiny-bf16.toml --emit=graph -o graph.mlir
// RUN: kilnc tiny-bf16.toml --emit=step -o step-kilnc.mlir
// RUN: kiln-opt graph.mlir -kiln-step-pipeline -o step.mlir
// RUN: cmp step-kilnc.mlir step.mlir
// RUN: FileCheck %s --check-prefix=BF16 < step.mlir
// RUN: kilnc tiny-bf16.toml --emit=plan --no-fusion -o plan-kilnc.mlir
// RUN: kiln-opt step.mlir -kiln-plan-pipeline=fusion=false -o plan.mlir
// RUN: cmp plan-kilnc.mlir plan.mlir
// RUN: kilnc tiny-bf16.toml --emit=plan --recompute cheap --bucket-mb 0.01 -o cheap-kilnc.mlir
// RUN: kiln-opt step.mlir '-kiln-plan-pipeline=recompute=cheap bucket-mb=0.01' -o cheap.mlir
// RUN: cmp cheap-kilnc.mlir cheap.mlir
// RUN: sed 's/target = "cpu"/target = "cuda"/' tiny-bf16.toml > tiny-cuda.toml
// RUN: kilnc tiny-cuda.toml --emit=step -o cuda-step.mlir
// RUN: kilnc tiny-cuda.toml --emit=plan -o cuda-plan-kilnc.mlir
// RUN: kiln-opt cuda-step.mlir -kiln-plan-pipeline -o cuda-plan.mlir
// RUN: cmp cuda-plan-kilnc.mlir cuda-plan.mlir
// RUN: not kiln-opt step.mlir -kiln-plan-pipeline=foo=1 2>&1 | FileCheck %s --check-prefix=UNKNOWN
// RUN: not kiln-opt graph.mlir -kiln-step-pipeline=precision=fp32 2>&1 | FileCheck %s --check-prefix=NOPRECISION
// A misspelt option: an error naming the pipeline and its options (MLIR's parser says only
// "<Pass-Options-Parser>: no such option fusoin"), as flag or in --pass-pipeline.
// RUN: not kiln-opt step.mlir '--kiln-plan-pipeline=fusoin=false' 2>&1 | FileCheck %s --check-prefix=TYPO
// RUN: not kiln-opt step.mlir '--kiln-plan-pipeline=fusoin=false' 2>&1 | count 1
// RUN: not kiln-opt step.mlir '--pass-pipeline=builtin.module(kiln-plan-pipeline{fusoin=false})' 2>&1 | FileCheck %s --check-prefix=TYPO
// RUN: not kiln-opt step.mlir -kiln-plan-pipeline=bucket-mb=x 2>&1 | FileCheck %s --check-prefix=NUMBER
// RUN: not kiln-opt step.mlir -kiln-plan-pipeline=bucket-mb=inf 2>&1 | FileCheck %s --check-prefix=INFINITE
// The spec is checked first: a bf16 step said to be fp32 is refused before any pass runs.
// RUN: sed '1s/precision = "bf16"/precision = "fp32"/' step.mlir > said-fp32.mlir
// RUN: not kiln-opt said-fp32.mlir -kiln-plan-pipeline 2>&1 | FileCheck %s --check-prefix=SPEC

// BF16-LABEL: func.func @micro_step
// BF16: kiln.cast {{.*}} -> tensor<{{.*}}xbf16>
// UNKNOWN: error: kiln-plan-pipeline: no such option foo (its options: bucket-mb, fusion, recompute, single-ops)
// NOPRECISION: error: kiln-step-pipeline: no such option precision (it takes none)
// TYPO: error: kiln-plan-pipeline: no such option fusoin (its options: bucket-mb, fusion, recompute, single-ops)
// NUMBER: for the --bucket-mb option: 'x' value invalid for floating point argument
// INFINITE: error: kiln-bucket-gradients: bucket-mb must be a positive finite number, not {{inf|INF}}
// SPEC: error: kiln.{{[a-z_]+}} computes in bf16 but 'kiln.spec' has precision = "fp32"
