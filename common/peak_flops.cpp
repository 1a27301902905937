// Peak FLOPS table (see peak_flops.h).
#include "common/peak_flops.h"

#include <cctype>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

namespace ts {

std::optional<double> PeakFlopsTable::lookup(const std::string& deviceName, const std::string& dtype) const {
    auto lower = [](std::string s) {
        for (char& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
        return s;
    };
    std::string dev = lower(deviceName), dt = lower(dtype);
    const std::map<std::string, double>* best = nullptr;
    size_t bestLen = 0;
    for (const auto& [name, row] : tflops) {
        std::string n = lower(name);
        if (n == dev) {
            best = &row;
            break;
        }
        if (!n.empty() && dev.find(n) != std::string::npos && n.size() > bestLen) {
            best = &row;
            bestLen = n.size();
        }
    }
    if (!best) return std::nullopt;
    for (const auto& [k, v] : *best)
        if (lower(k) == dt) return v;
    return std::nullopt;
}

Result<PeakFlopsTable> loadPeakFlopsTable(const std::string& path) {
    std::ifstream in(path);
    if (!in) return Status::notFound("peak FLOPS table '" + path + "' cannot be read");
    nlohmann::json j = nlohmann::json::parse(in, nullptr, false, true);
    if (j.is_discarded() || !j.is_object() || !j.contains("devices") || !j["devices"].is_object())
        return Status::invalid("peak FLOPS table '" + path +
                               "' must be JSON {\"devices\": {\"<device>\": {\"<dtype>\": tflops}}}");
    PeakFlopsTable t;
    for (auto& [dev, row] : j["devices"].items()) {
        if (!row.is_object()) return Status::invalid("peak FLOPS table '" + path + "': entry '" + dev + "' is not an object");
        for (auto& [dtype, v] : row.items()) {
            if (!v.is_number())
                return Status::invalid("peak FLOPS table '" + path + "': " + dev + "." + dtype + " is not a number");
            t.tflops[dev][dtype] = v.get<double>();
        }
    }
    return t;
}

std::string defaultPeakFlopsTablePath() {
#ifdef TS_SOURCE_DIR
    std::string p = std::string(TS_SOURCE_DIR) + "/resources/peak_flops.json";
    if (std::filesystem::exists(p)) return p;
#endif
    for (const char* rel : {"resources/peak_flops.json", "../resources/peak_flops.json", "../share/trainscope/peak_flops.json"})
        if (std::filesystem::exists(rel)) return rel;
    return "";
}

}  // namespace ts
