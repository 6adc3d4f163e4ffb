#include "compiler/pipeline.h"

#include "mlir/Pass/PassRegistry.h"
#include "mlir/Transforms/Passes.h"
#include "passes/Passes.h"

using namespace mlir;

namespace kiln {

void buildStepPipeline(OpPassManager& pm, const std::string& precision) {
  if (precision == "bf16") pm.addPass(createMixedPrecision());
  pm.addPass(createAutodiff());
  pm.addPass(createBuildOptimizerStep());
  pm.addPass(createCanonicalizerPass());  // folds reshape and cast chains, drops dead statistics,
                                          // reads bf16 weights from their compute copies
  pm.addPass(createCSEPass());            // one read per parameter / hyperparameter
}

void buildPlanPipeline(OpPassManager& pm, const std::string& recompute, double bucket_mb, bool fusion,
                       bool singleOps) {
  RecomputeOptions options;
  options.mode = recompute;
  pm.addPass(createRecompute(options));
  pm.addPass(createSchedule());
  FuseKernelsOptions fuse;
  fuse.singleOps = singleOps;
  if (fusion) pm.addPass(createFuseKernels(fuse));  // on the scheduled order
  BucketGradientsOptions buckets;
  buckets.bucketMB = bucket_mb;
  pm.addPass(createBucketGradients(buckets));  // after the regions that accumulate gradients
  pm.addPass(createPlanBuffers());
}

void registerKilnPipelines() {
  PassPipelineRegistration<>("kiln-plan-pipeline", "recompute (none), schedule, fuse kernels, gradient buckets, plan buffers",
                             [](OpPassManager& pm) { buildPlanPipeline(pm); });
  PassPipelineRegistration<>("kiln-step-pipeline",
                             "graph IR (@forward) to the simplified training step",
                             [](OpPassManager& pm) { buildStepPipeline(pm); });
}

void setModuleSpec(ModuleOp module, const ModelSpec& s) {
  Builder b(module.getContext());
  auto i = [&](int v) { return b.getI64IntegerAttr(v); };
  module->setAttr("kiln.spec",
                  b.getDictionaryAttr({
                      b.getNamedAttr("path", b.getStringAttr(s.path)),
                      b.getNamedAttr("name", b.getStringAttr(s.name)),
                      b.getNamedAttr("n_layer", i(s.n_layer)),
                      b.getNamedAttr("n_head", i(s.n_head)),
                      b.getNamedAttr("n_embd", i(s.n_embd)),
                      b.getNamedAttr("vocab_size", i(s.vocab_size)),
                      b.getNamedAttr("block_size", i(s.block_size)),
                      b.getNamedAttr("batch_size", i(s.batch_size)),
                      b.getNamedAttr("seq_len", i(s.seq_len)),
                      b.getNamedAttr("precision", b.getStringAttr(s.precision)),
                      b.getNamedAttr("target", b.getStringAttr(s.target)),
                  }));
}

FailureOr<ModelSpec> getModuleSpec(ModuleOp module) {
  auto dict = module->getAttrOfType<DictionaryAttr>("kiln.spec");
  if (!dict) return module.emitError("the module has no 'kiln.spec' attribute (was it built by kilnc?)");
  ModelSpec s;
  auto str = [&](const char* k, std::string& out) {
    if (auto a = dict.getAs<StringAttr>(k)) out = a.str();
  };
  bool ok = true;
  auto num = [&](const char* k, int& out) {
    if (auto a = dict.getAs<IntegerAttr>(k)) out = int(a.getInt());
    else ok = false;
  };
  str("path", s.path);
  str("name", s.name);
  str("precision", s.precision);
  str("target", s.target);
  num("n_layer", s.n_layer);
  num("n_head", s.n_head);
  num("n_embd", s.n_embd);
  num("vocab_size", s.vocab_size);
  num("block_size", s.block_size);
  num("batch_size", s.batch_size);
  num("seq_len", s.seq_len);
  if (!ok) return module.emitError("'kiln.spec' lacks one of the integer model sizes");
  return s;
}

}  // namespace kiln
