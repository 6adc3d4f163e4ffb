// kiln-opt's -kiln-plan-pipeline with no options plans as kilnc with no planning flags: the same
// defaults (recompute none, 25 MB buckets, fusion on, single-ops off on target cpu). The model
// is gpt2-tiny widened to about 3 MB of gradients, so a smaller default bucket would split them.
// RUN: rm -rf %t && mkdir %t && cd %t
// RUN: sed -e 's/n_embd = 64/n_embd = 128/' -e 's/vocab_size = 512/vocab_size = 2048/' %kiln_src/models/gpt2-tiny.toml > wide.toml
// RUN: kilnc wide.toml --emit=step -o step.mlir
// RUN: kilnc wide.toml --emit=plan -o plan-kilnc.mlir
// RUN: kiln-opt step.mlir -kiln-plan-pipeline -o plan.mlir
// RUN: cmp plan-kilnc.mlir plan.mlir
// An option reaches its pass: single-ops=true plans as kiln-fuse-kernels{single-ops=true} does
// when named in the pipeline itself (kilnc --fuse-single-ops shares the builder, so comparing
// with kilnc would not tell a dropped option).
// RUN: kiln-opt step.mlir -kiln-plan-pipeline=single-ops=true -o single.mlir
// RUN: kiln-opt step.mlir '--pass-pipeline=builtin.module(kiln-recompute{mode=none},kiln-schedule,kiln-fuse-kernels{single-ops=true},kiln-bucket-gradients{bucket-mb=25},kiln-plan-buffers)' -o single-passes.mlir
// RUN: cmp single-passes.mlir single.mlir
// RUN: not cmp -s plan.mlir single.mlir
