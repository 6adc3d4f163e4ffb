// LD_PRELOAD: oneDNN makes no primitive (dnnl_primitive_desc_create fails with
// dnnl_unimplemented), so the generated CPU kernels' bf16 products take their BLAS fallback.
int dnnl_primitive_desc_create(void** pd, const void* op_desc, const void* attr, void* engine, const void* hint) {
  (void)pd, (void)op_desc, (void)attr, (void)engine, (void)hint;
  return 3;
}
