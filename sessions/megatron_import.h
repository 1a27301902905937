// Import of a Megatron-LM launch (issue #14): a pretrain_gpt.py argument list, or a shell
// script that holds one, becomes a trainscope Config. The mapping is the knob registry's
// megatronFlag / megatronFalseFlag (the same fields export writes), so export and import
// cannot disagree; every argument that maps to no knob is listed by name, never dropped.
#pragma once

#include <string>
#include <vector>

#include "common/status.h"
#include "engine/config/config.h"

namespace ts::sessions {

struct MegatronImport {
    engine::Config config;
    std::vector<std::string> unmapped;  // "--tokenizer-type GPT2BPETokenizer" (flag and its values)
    std::vector<std::string> notes;     // what was derived, ignored or could not be expanded
};

// argv: the arguments after pretrain_gpt.py (no interpreter / launcher tokens needed, but a
// leading "torchrun ... pretrain_gpt.py" is skipped when present).
Result<MegatronImport> configFromMegatronArgs(const std::vector<std::string>& argv);

// A shell script or command line: backslash continuations, quotes, comments, VAR=value and
// bash arrays VAR=( ... ) defined in the script are expanded; other $VARIABLES are reported.
Result<MegatronImport> configFromMegatronScript(const std::string& text);

// Shrinks the model shape (layers, hidden, heads, head dim, ffn, seq, vocab, expert sizes) to a
// model a single node runs in seconds, keeping the parallel layout (tp, pp, vpp, cp, ep, the
// first/last stage split) and every performance knob, so a large launch's knobs can be tuned
// on a small run and exported back. Returns one line per knob it changed ("num_layers 80 -> 4").
std::vector<std::string> shrinkModelShape(engine::Config& c);

// Shell words of one script (exposed for tests); unexpanded variables are listed in notes.
std::vector<std::string> shellWords(const std::string& text, std::vector<std::string>* notes = nullptr);

}  // namespace ts::sessions
