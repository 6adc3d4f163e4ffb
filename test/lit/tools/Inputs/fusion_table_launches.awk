# kiln-inspect's fusion summary against its kernel table: the table's launches column (a training
# step's, each kernel's runs times its launches per run), less the optimizer's rows, must add up
# to the summary's launches per micro-step less its built-in ones (which have no row).
/^fusion / {
  for (i = 1; i <= NF; i++) {
    if ($i == "per" && $(i + 1) == "micro-step") step = $(i - 1) == "launches" ? $(i - 3) : $(i - 2)
    if ($i == "them" && $(i + 2) == "runtime's") builtin = $(i - 2)
  }
}
/^  [a-z_]+ +[a-z0-9_]+ +[0-9]+ +[0-9]+  / { if ($1 != "optimizer") rows += $4 }
END { print "table " rows ", summary " step " - " builtin " built-in: " (rows == step - builtin ? "agree" : "DIFFER") }
