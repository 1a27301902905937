// Derived sizes of a validated config (Megatron's rules for world, dp, microbatches, vocab).
#include "engine/config/config.h"

#include <algorithm>
#include <cctype>
#include <cstdint>

namespace ts::engine {

double moeAuxLossCoeff(const Config& c, std::string_view type) {
    const auto& types = c.moe_router_load_balancing_type.items;
    const auto& coeffs = c.moe_aux_loss_coeff.items;
    for (size_t i = 0; i < types.size(); ++i)
        if (types[i] == type) return types.size() == 1 ? coeffs[0] : i < coeffs.size() ? coeffs[i] : 0.0;
    return 0.0;
}

std::string moeLoadBalancingText(const Config& c) {
    const auto& types = c.moe_router_load_balancing_type.items;
    if (types.size() == 1) return types[0];
    std::string out = "[";
    for (size_t i = 0; i < types.size(); ++i) out += (i ? ", " : "") + types[i];
    return out + "]";
}

DerivedSizes deriveSizes(const Config& c) {
    DerivedSizes d;
    d.tp = std::max(1, c.tensor_model_parallel_size);
    d.pp = std::max(1, c.pipeline_model_parallel_size);
    d.vpp = std::max(1, c.virtual_pipeline_model_parallel_size);
    d.cp = std::max(1, c.context_parallel_size);
    d.ep = std::max(1, c.expert_model_parallel_size);
    d.etp = c.expert_tensor_parallel_size > 0 ? c.expert_tensor_parallel_size : d.tp;
    const int mp = d.tp * d.cp * d.pp;
    if (c.data_parallel_size > 0) {
        d.dp = c.data_parallel_size;
        d.world = c.world_size > 0 ? c.world_size : mp * d.dp;
    } else if (c.world_size > 0) {
        d.world = c.world_size;
        d.dp = std::max(1, c.world_size / mp);
    } else {
        d.dp = 1;
        d.world = mp;
    }
    if (c.num_microbatches > 0) {
        d.num_microbatches = c.num_microbatches;
        d.global_batch_size = c.global_batch_size > 0
                                  ? c.global_batch_size
                                  : c.micro_batch_size * d.dp * d.num_microbatches;
    } else if (c.global_batch_size > 0) {
        d.global_batch_size = c.global_batch_size;
        d.num_microbatches = std::max(1, c.global_batch_size / std::max(1, c.micro_batch_size * d.dp));
    } else {
        d.num_microbatches = 1;
        d.global_batch_size = c.micro_batch_size * d.dp;
    }
    const int mult = std::max(1, c.make_vocab_size_divisible_by) * d.tp;
    d.padded_vocab_size = ((c.vocab_size + mult - 1) / mult) * mult;
    d.num_query_groups = c.num_query_groups > 0 ? c.num_query_groups : c.num_attention_heads;
    d.kv_channels = c.kv_channels > 0 ? c.kv_channels
                                      : (c.num_attention_heads > 0 ? c.hidden_size / c.num_attention_heads : 0);
    if (c.ffn_hidden_size > 0) {
        d.ffn_hidden_size = c.ffn_hidden_size;
    } else if (c.swiglu) {
        // Megatron-LM validate_args: the gated MLP has two input projections, so its width is
        // cut to 2/3 of 4h (same parameter count) and rounded down to a multiple of 64.
        d.ffn_hidden_size = int((4.0 * c.hidden_size * 2.0 / 3.0) / 64.0) * 64;
    } else {
        d.ffn_hidden_size = 4 * c.hidden_size;
    }
    return d;
}

}  // namespace ts::engine

namespace ts::engine {
namespace {

// A value of Megatron's moe_layer_freq expression: an integer or a list of integers.
struct FreqValue {
    bool isList = false;
    int64_t n = 0;
    std::vector<int> list;
};

// Recursive-descent parser of the Python subset Megatron's moe_freq_type evaluates:
//   expr := term ('+' term)* ; term := atom ('*' atom)* ; atom := INT | '[' [expr (',' expr)*] ']' | '(' expr ')'
class FreqParser {
public:
    explicit FreqParser(const std::string& s) : m_s(s) {}

    bool parse(FreqValue& out, std::string& err) {
        if (!expr(out, err)) return false;
        skip();
        if (m_i != m_s.size()) return fail(err, "unexpected '" + std::string(1, m_s[m_i]) + "'");
        return true;
    }

private:
    static constexpr size_t kMaxLen = 1 << 16;

    void skip() {
        while (m_i < m_s.size() && std::isspace(static_cast<unsigned char>(m_s[m_i]))) ++m_i;
    }
    bool eat(char ch) {
        skip();
        if (m_i < m_s.size() && m_s[m_i] == ch) {
            ++m_i;
            return true;
        }
        return false;
    }
    bool fail(std::string& err, const std::string& what) {
        err = what + " at position " + std::to_string(m_i + 1);
        return false;
    }
    bool expr(FreqValue& v, std::string& err) {
        if (!term(v, err)) return false;
        while (eat('+')) {
            FreqValue r;
            if (!term(r, err)) return false;
            if (v.isList != r.isList) return fail(err, "'+' joins a list and an integer");
            if (v.isList) {
                v.list.insert(v.list.end(), r.list.begin(), r.list.end());
                if (v.list.size() > kMaxLen) return fail(err, "the list is too long");
            } else {
                v.n += r.n;
            }
        }
        return true;
    }
    bool term(FreqValue& v, std::string& err) {
        if (!atom(v, err)) return false;
        while (eat('*')) {
            FreqValue r;
            if (!atom(r, err)) return false;
            if (v.isList && r.isList) return fail(err, "'*' of two lists");
            if (!v.isList && !r.isList) {
                v.n *= r.n;
                if (v.n > int64_t(kMaxLen) || v.n < -int64_t(kMaxLen)) return fail(err, "the number is too large");
                continue;
            }
            const FreqValue& l = v.isList ? v : r;
            const int64_t times = v.isList ? r.n : v.n;
            if (times > 0 && l.list.size() * size_t(times) > kMaxLen) return fail(err, "the list is too long");
            FreqValue out;
            out.isList = true;
            for (int64_t t = 0; t < times; ++t) out.list.insert(out.list.end(), l.list.begin(), l.list.end());
            v = std::move(out);
        }
        return true;
    }
    bool atom(FreqValue& v, std::string& err) {
        skip();
        if (eat('(')) {
            if (!expr(v, err)) return false;
            if (!eat(')')) return fail(err, "expected ')'");
            return true;
        }
        if (eat('[')) {
            v = FreqValue{};
            v.isList = true;
            if (eat(']')) return true;
            do {
                FreqValue e;
                if (!expr(e, err)) return false;
                if (e.isList) return fail(err, "a list inside a list");
                v.list.push_back(int(e.n));
            } while (eat(','));
            if (!eat(']')) return fail(err, "expected ',' or ']'");
            return true;
        }
        size_t j = m_i;
        while (j < m_s.size() && std::isdigit(static_cast<unsigned char>(m_s[j]))) ++j;
        if (j == m_i || j - m_i > 6) return fail(err, j == m_i ? "expected an integer, '[' or '('" : "the number is too large");
        v = FreqValue{};
        v.n = std::stoll(m_s.substr(m_i, j - m_i));
        m_i = j;
        return true;
    }

    const std::string& m_s;
    size_t m_i = 0;
};

}  // namespace

std::vector<int> moeLayerPattern(const std::string& freq, int numLayers, std::string* error) {
    std::string err;
    FreqValue v;
    if (freq.find_first_not_of(" \t") == std::string::npos) err = "it is empty";
    else if (!FreqParser(freq).parse(v, err)) err = "'" + freq + "' is not an integer or a list expression: " + err;
    else if (!v.isList && v.n < 1) err = "an integer moe_layer_freq must be at least 1 (got " + std::to_string(v.n) + ")";
    else if (v.isList && std::any_of(v.list.begin(), v.list.end(), [](int x) { return x != 0 && x != 1; }))
        err = "the list may hold only 0 (dense) and 1 (MoE)";
    else if (v.isList && numLayers >= 0 && int(v.list.size()) != numLayers)
        err = "the list has " + std::to_string(v.list.size()) + " entries; it needs one per layer (num_layers=" +
              std::to_string(numLayers) + ")";
    if (!err.empty()) {
        if (error) *error = err;
        return {};
    }
    if (v.isList) return v.list;
    if (numLayers < 0) return {int(v.n)};
    std::vector<int> out(static_cast<size_t>(numLayers));
    for (int i = 0; i < numLayers; ++i) out[size_t(i)] = i % int(v.n) == 0 ? 1 : 0;
    return out;
}

std::vector<int> moeLayerPattern(const Config& c) {
    std::vector<int> out;
    if (c.num_moe_experts > 0) out = moeLayerPattern(c.moe_layer_freq, c.num_layers, nullptr);
    out.resize(static_cast<size_t>(std::max(0, c.num_layers)), 0);
    return out;
}

}  // namespace ts::engine
