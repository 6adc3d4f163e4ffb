// kiln-opt's pipelines take kilnc's choices as options and give kilnc's IR: the step of a bf16
// spec, and plans with --no-fusion, --recompute cheap and --bucket-mb. Unknown options and
// values are errors, not ignored.
// RUN: rm -rf %t && mkdir %t && cd %t
// RUN: sed 's/precision = "fp32"/precision = "bf16"/' %kiln_src/models/gpt2-tiny.toml > tiny-bf16.toml
// RUN: kilnc tiny-bf16.toml --emit=graph -o graph.mlir
// RUN: kilnc tiny-bf16.toml --emit=step -o step-kilnc.mlir
// RUN: kiln-opt graph.mlir -kiln-step-pipeline=precision=bf16 -o step.mlir
// RUN: cmp step-kilnc.mlir step.mlir
// RUN: FileCheck %s --check-prefix=BF16 < step.mlir
// RUN: kilnc tiny-bf16.toml --emit=plan --no-fusion -o plan-kilnc.mlir
// RUN: kiln-opt step.mlir -kiln-plan-pipeline=fusion=false -o plan.mlir
// RUN: cmp plan-kilnc.mlir plan.mlir
// RUN: kilnc tiny-bf16.toml --emit=plan --recompute cheap --bucket-mb 0.01 -o cheap-kilnc.mlir
// RUN: kiln-opt step.mlir '-kiln-plan-pipeline=recompute=cheap bucket-mb=0.01' -o cheap.mlir
// RUN: cmp cheap-kilnc.mlir cheap.mlir
// RUN: not kiln-opt step.mlir -kiln-plan-pipeline=foo=1 2>&1 | FileCheck %s --check-prefix=UNKNOWN
// RUN: not kiln-opt step.mlir -kiln-plan-pipeline=bucket-mb=x 2>&1 | FileCheck %s --check-prefix=NUMBER
// RUN: not kiln-opt graph.mlir -kiln-step-pipeline=precision=fp16 2>&1 | FileCheck %s --check-prefix=PRECISION

// BF16-LABEL: func.func @micro_step
// BF16: kiln.cast {{.*}} -> tensor<{{.*}}xbf16>
// UNKNOWN: no such option foo
// NUMBER: for the --bucket-mb option: 'x' value invalid for floating point argument
// PRECISION: for the --precision option: Cannot find option named 'fp16'
