// A deterministic C++17 workload heavy on the standard containers, for the real-program tests:
// std::string building and concatenation, std::map / std::unordered_map with string keys,
// std::vector growth and sorting, shared_ptr/unique_ptr nodes, and two worker threads doing the
// same on their own data. Every result feeds a checksum printed on stdout, so a run under
// alloclens must print exactly what a plain run prints. Runs well under a second.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <numeric>
#include <sstream>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

namespace {

// FNV-1a, so the checksum does not depend on std::hash (which may differ between libraries).
std::uint64_t fnv(std::uint64_t h, const std::string &s) {
    for (unsigned char c : s) {
        h ^= c;
        h *= 1099511628211ull;
    }
    return h;
}

std::uint64_t mix(std::uint64_t h, std::uint64_t v) {
    return fnv(h, std::to_string(v));
}

// Small deterministic PRNG (xorshift64*), independent of the standard library's engines.
struct Rng {
    std::uint64_t s;
    explicit Rng(std::uint64_t seed) : s(seed ? seed : 1) {}
    std::uint64_t next() {
        s ^= s >> 12;
        s ^= s << 25;
        s ^= s >> 27;
        return s * 2685821657736338717ull;
    }
    std::uint64_t below(std::uint64_t n) { return next() % n; }
};

std::string word(Rng &rng) {
    static const char *syll[] = {"ka", "lo", "mi", "nu", "pe", "ra", "si", "to", "vu", "zen",
                                 "qua", "bri", "xo", "lyth", "or"};
    std::string w;
    int n = 1 + static_cast<int>(rng.below(5));
    for (int i = 0; i < n; i++)
        w += syll[rng.below(sizeof syll / sizeof *syll)];
    return w;
}

struct Summary {
    std::uint64_t hash = 14695981039346656037ull;
    std::size_t words = 0, distinct = 0, longest = 0;
};

// Word counting with std::map and std::unordered_map, text built with strings and streams.
Summary text_work(std::uint64_t seed, int rounds) {
    Rng rng(seed);
    Summary out;
    std::map<std::string, int> ordered;
    std::unordered_map<std::string, std::vector<int>> positions;
    for (int r = 0; r < rounds; r++) {
        std::string line;
        int nw = 5 + static_cast<int>(rng.below(20));
        for (int i = 0; i < nw; i++) {
            if (!line.empty())
                line += ' ';
            line += word(rng);
        }
        std::istringstream in(line);
        std::string w;
        int pos = 0;
        while (in >> w) {
            ordered[w]++;
            positions[w].push_back(r * 100 + pos++);
            out.words++;
            out.longest = std::max(out.longest, w.size());
        }
        // Occasionally drop rare words so nodes get freed and reused.
        if (r % 97 == 96) {
            for (auto it = ordered.begin(); it != ordered.end();) {
                if (it->second == 1) {
                    positions.erase(it->first);
                    it = ordered.erase(it);
                } else {
                    ++it;
                }
            }
        }
    }
    out.distinct = ordered.size();
    for (const auto &kv : ordered) {
        out.hash = fnv(out.hash, kv.first);
        out.hash = mix(out.hash, static_cast<std::uint64_t>(kv.second));
        const auto &p = positions.at(kv.first);
        out.hash = mix(out.hash, std::accumulate(p.begin(), p.end(), std::uint64_t{0}));
    }
    return out;
}

// Vectors of strings and of structs: growth, sort, unique, erase.
std::uint64_t vector_work(std::uint64_t seed, int n) {
    Rng rng(seed);
    std::vector<std::string> names;
    for (int i = 0; i < n; i++) {
        std::ostringstream o;
        o << word(rng) << '-' << rng.below(1000) << '-' << std::string(rng.below(40), 'x');
        names.push_back(o.str());
    }
    std::sort(names.begin(), names.end());
    names.erase(std::unique(names.begin(), names.end()), names.end());
    struct Rec {
        std::string key;
        std::vector<double> vals;
    };
    std::vector<std::unique_ptr<Rec>> recs;
    for (std::size_t i = 0; i < names.size(); i += 3) {
        auto r = std::make_unique<Rec>();
        r->key = names[i] + "/" + std::to_string(i);
        for (std::size_t j = 0; j < i % 17; j++)
            r->vals.push_back(static_cast<double>(j) * 0.5);
        recs.push_back(std::move(r));
    }
    std::stable_sort(recs.begin(), recs.end(), [](const auto &a, const auto &b) {
        return a->vals.size() < b->vals.size();
    });
    std::uint64_t h = 14695981039346656037ull;
    for (const auto &r : recs) {
        h = fnv(h, r->key);
        h = mix(h, static_cast<std::uint64_t>(std::accumulate(r->vals.begin(), r->vals.end(), 0.0) * 2));
    }
    h = mix(h, names.size());
    return h;
}

// A small tree of shared_ptr nodes with string payloads, built and torn down repeatedly.
struct Node {
    std::string label;
    std::vector<std::shared_ptr<Node>> kids;
};

std::shared_ptr<Node> build(Rng &rng, int depth) {
    auto n = std::make_shared<Node>();
    n->label = word(rng) + std::to_string(depth);
    if (depth > 0) {
        int k = 1 + static_cast<int>(rng.below(3));
        for (int i = 0; i < k; i++)
            n->kids.push_back(build(rng, depth - 1));
    }
    return n;
}

std::uint64_t walk(const Node &n, std::uint64_t h) {
    h = fnv(h, n.label);
    for (const auto &k : n.kids)
        h = walk(*k, h);
    return h;
}

std::uint64_t tree_work(std::uint64_t seed, int rounds) {
    Rng rng(seed);
    std::uint64_t h = 14695981039346656037ull;
    for (int i = 0; i < rounds; i++) {
        auto root = build(rng, 6);
        h = walk(*root, h);
    }
    return h;
}

}  // namespace

int main() {
    // Two worker threads, each with its own data, so the allocator sees parallel traffic.
    Summary ts[2];
    std::uint64_t vs[2] = {0, 0};
    std::thread workers[2];
    for (int t = 0; t < 2; t++) {
        workers[t] = std::thread([t, &ts, &vs] {
            ts[t] = text_work(1000 + t, 3000);
            vs[t] = vector_work(2000 + t, 8000);
        });
    }
    Summary main_text = text_work(42, 3000);
    std::uint64_t main_vec = vector_work(43, 8000);
    std::uint64_t main_tree = tree_work(44, 40);
    for (auto &w : workers)
        w.join();

    std::printf("text main: words=%zu distinct=%zu longest=%zu hash=%016llx\n", main_text.words,
                main_text.distinct, main_text.longest, static_cast<unsigned long long>(main_text.hash));
    for (int t = 0; t < 2; t++)
        std::printf("text thread%d: words=%zu distinct=%zu longest=%zu hash=%016llx\n", t, ts[t].words,
                    ts[t].distinct, ts[t].longest, static_cast<unsigned long long>(ts[t].hash));
    std::printf("vector main=%016llx thread0=%016llx thread1=%016llx\n",
                static_cast<unsigned long long>(main_vec), static_cast<unsigned long long>(vs[0]),
                static_cast<unsigned long long>(vs[1]));
    std::printf("tree main=%016llx\n", static_cast<unsigned long long>(main_tree));
    std::uint64_t all = main_text.hash ^ ts[0].hash ^ ts[1].hash ^ main_vec ^ vs[0] ^ vs[1] ^ main_tree;
    std::printf("checksum %016llx\n", static_cast<unsigned long long>(all));
    return 0;
}
