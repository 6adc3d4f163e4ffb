#include "compiler/pipeline.h"

#include "Kiln/KilnDialect.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Pass/Pass.h"
#include "mlir/Pass/PassRegistry.h"
#include "mlir/Transforms/Passes.h"
#include "llvm/ADT/StringExtras.h"
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

namespace {

// kilnc's two stages as kiln-opt pipelines. The choices a spec makes come from the module's
// kiln.spec (its precision; on target "cuda" every op gets a generated kernel), as in kilnc; a
// module without one is taken as fp32 for target "cpu". kilnc's flags are options, e.g.
// -kiln-plan-pipeline='recompute=cheap bucket-mb=1 fusion=false'; an unknown one is an error.
// The option names, for the error about an unknown one (OptionsMap: llvm::cl's, which
// PassOptions keeps protected).
template <typename T>
struct NamedOptions : PassPipelineOptions<T> {
  std::string names() const {
    std::vector<std::string> keys;
    for (const auto& entry : this->OptionsMap) keys.push_back(entry.getKey().str());
    llvm::sort(keys);
    return keys.empty() ? "it takes none" : "its options: " + llvm::join(keys.begin(), keys.end(), ", ");
  }
};

struct StepPipelineOptions : NamedOptions<StepPipelineOptions> {};

struct PlanPipelineOptions : NamedOptions<PlanPipelineOptions> {
  Option<std::string> recompute{*this, "recompute", llvm::cl::desc("none | cheap (kiln-recompute's mode)"),
                                llvm::cl::init("none")};
  Option<double> bucketMB{*this, "bucket-mb", llvm::cl::desc("gradient bucket size in MB (kiln-bucket-gradients)"),
                          llvm::cl::init(25.0)};
  Option<bool> fusion{*this, "fusion", llvm::cl::desc("run kiln-fuse-kernels (kilnc --no-fusion: false)"),
                      llvm::cl::init(true)};
  Option<bool> singleOps{*this, "single-ops",
                         llvm::cl::desc("lone ops get generated kernels too (kilnc --fuse-single-ops; always on target cuda)"),
                         llvm::cl::init(false)};
};

// Reads the module's kiln.spec, then builds the stage's passes for it and runs them (a dynamic
// pipeline: which passes run depends on the module).
class SpecStage : public PassWrapper<SpecStage, OperationPass<ModuleOp>> {
 public:
  MLIR_DEFINE_EXPLICIT_INTERNAL_INLINE_TYPE_ID(SpecStage)
  using Build = std::function<void(OpPassManager&, const ModelSpec&)>;
  SpecStage(std::string name, Build build) : name_(std::move(name)), build_(std::move(build)) {}

  StringRef getArgument() const override { return name_; }
  StringRef getName() const override { return name_; }
  void getDependentDialects(DialectRegistry& registry) const override {
    ModelSpec widest;  // the most passes the stage can run
    widest.precision = "bf16";
    widest.target = "cuda";
    OpPassManager pm(ModuleOp::getOperationName());
    build_(pm, widest);
    pm.getDependentDialects(registry);
  }
  void runOnOperation() override {
    ModelSpec spec;
    if (getOperation()->hasAttr("kiln.spec")) {
      FailureOr<ModelSpec> s = getModuleSpec(getOperation());
      if (failed(s)) return signalPassFailure();
      spec = *s;
    }
    // Planning graph IR (@forward, before kiln-autodiff) would leave fusion regions and offsets
    // that the step pipeline cannot take, and kilnc refuses: the planning passes run on the step.
    if (name_ == "kiln-plan-pipeline" && getOperation().lookupSymbol("forward") &&
        !getOperation().lookupSymbol("micro_step")) {
      getOperation().emitError("kiln-plan-pipeline: graph IR (no @micro_step); plan the training step: "
                               "run -kiln-step-pipeline first (or kilnc --emit=step)");
      return signalPassFailure();
    }
    OpPassManager pm(ModuleOp::getOperationName());
    build_(pm, spec);
    if (failed(runPipeline(pm, getOperation()))) signalPassFailure();
  }

 private:
  std::string name_;
  Build build_;
};

// As PassPipelineRegistration, but an option MLIR's parser refuses is an error naming the
// pipeline and its options, where MLIR prints "<Pass-Options-Parser>: no such option X" alone.
template <typename Options>
void registerPipeline(StringRef arg, StringRef description,
                      std::function<void(OpPassManager&, const Options&)> builder) {
  registerPassPipeline(
      arg, description,
      [arg, builder](OpPassManager& pm, StringRef text, function_ref<LogicalResult(const Twine&)> errorHandler) {
        Options options;
        std::string why;
        llvm::raw_string_ostream os(why);
        if (failed(options.parseFromString(text, os))) {
          StringRef message = StringRef(why).trim();
          message.consume_front("<Pass-Options-Parser>: ");
          return errorHandler(arg + ": " + message + " (" + options.names() + ")");
        }
        builder(pm, options);
        return success();
      },
      [](function_ref<void(const mlir::detail::PassOptions&)> handler) { handler(Options()); });
}

}  // namespace

void registerKilnPipelines() {
  registerPipeline<PlanPipelineOptions>(
      "kiln-plan-pipeline", "kiln-recompute, kiln-schedule, kiln-fuse-kernels (single-ops on target cuda), "
      "kiln-bucket-gradients, kiln-plan-buffers, as kilnc (which --print-pipeline prints them for a spec)",
      [](OpPassManager& pm, const PlanPipelineOptions& o) {
        pm.addPass(std::make_unique<SpecStage>(
            "kiln-plan-pipeline", [recompute = std::string(o.recompute), bucketMB = double(o.bucketMB),
                                   fusion = bool(o.fusion), singleOps = bool(o.singleOps)](OpPassManager& stage, const ModelSpec& s) {
              buildPlanPipeline(stage, recompute, bucketMB, fusion, singleOps || s.target == "cuda");
            }));
      });
  registerPipeline<StepPipelineOptions>(
      "kiln-step-pipeline", "graph IR (@forward) to the simplified training step: kiln-mixed-precision (bf16 specs), "
      "kiln-autodiff, kiln-build-optimizer-step, canonicalize, cse, as kilnc (which --print-pipeline prints them "
      "for a spec)",
      [](OpPassManager& pm, const StepPipelineOptions&) {
        pm.addPass(std::make_unique<SpecStage>(
            "kiln-step-pipeline", [](OpPassManager& stage, const ModelSpec& s) { buildStepPipeline(stage, s.precision); }));
      });
}

}  // namespace kiln
