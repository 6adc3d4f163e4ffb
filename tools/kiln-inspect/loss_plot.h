// `kiln-inspect plot LOG.jsonl... -o loss.svg`: training (and validation) loss curves.
#pragma once
#include <string>
#include <vector>

namespace kiln {

// Reads the JSONL logs the training executables write (one object per line with "step" and
// "loss", and "val_loss" on evaluation steps) and returns an SVG drawing of the curves.
// Throws kiln::Error naming the file and line of a malformed record.
std::string loss_plot_svg(const std::vector<std::string>& logs);

}  // namespace kiln
