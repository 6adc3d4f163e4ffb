# train-samples.test: the losses of a run with samples and one without, the steps that logged
# samples, and the last of them against `sample`'s output.
import json, sys

a = [json.loads(l) for l in open(sys.argv[1])]
b = [json.loads(l) for l in open(sys.argv[2])]
assert [r["loss"] for r in a] == [r["loss"] for r in b], ([r["loss"] for r in a], [r["loss"] for r in b])
print("losses of %d steps equal with and without samples" % len(a))
print("samples at steps", [r["step"] for r in a if "samples" in r])
assert all("samples" not in r for r in b)
printed = [l for l in open(sys.argv[3]).read().splitlines() if not l.startswith("---")]
last = [" ".join(map(str, ids)) for ids in a[-1]["samples"]]
assert printed == last, (printed, last)
print("the last samples are sample's")
