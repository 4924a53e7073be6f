#include "diff/diff_report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "diff/element_values.h"

namespace ckpt {
namespace {

using json = nlohmann::ordered_json;

std::string num(double v) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

std::string element_value(double re, double im, bool complex) {
  if (!complex) return num(re);
  std::string out = "(";
  out += num(re);
  out += std::signbit(im) ? '-' : '+';
  out += num(std::fabs(im));
  out += "j)";
  return out;
}

// Row-major flat index -> per-dimension index.
Shape unravel(uint64_t flat, const Shape& shape) {
  Shape idx(shape.size(), 0);
  for (std::size_t d = shape.size(); d-- > 0;) {
    auto extent = static_cast<uint64_t>(shape[d]);
    idx[d] = static_cast<int64_t>(flat % extent);
    flat /= extent;
  }
  return idx;
}

std::string index_str(const Shape& idx) {
  std::string s = "[";
  for (std::size_t i = 0; i < idx.size(); ++i) s += (i ? ", " : "") + std::to_string(idx[i]);
  return s + "]";
}

bool any_complex(const TensorDiff& t) { return dtype_info(t.dtype_a).is_complex || dtype_info(t.dtype_b).is_complex; }

// The shape a sample's index counts in: float4_e2m1fn_x2's values, two a
// byte, lie along a doubled last dimension.
Shape value_shape(const TensorDiff& t) {
  if (packed_values(t.dtype_a) == 1) return t.shape_a;
  if (t.shape_a.empty()) return {2};
  Shape s = t.shape_a;
  s.back() *= packed_values(t.dtype_a);
  return s;
}

std::string sample_str(const TensorDiff& t, const ElementSample& s) {
  bool c = any_complex(t);
  return index_str(unravel(s.index, value_shape(t))) + " (" + element_value(s.a_re, s.a_im, c) + " vs " +
         element_value(s.b_re, s.b_im, c) + ")";
}

std::string dtype_text(const TensorDiff& t) {
  std::string s(dtype_name(t.dtype_a));
  return t.dtype_differs() ? s + " vs " + std::string(dtype_name(t.dtype_b)) : s;
}

void print_tensor(const TensorDiff& t, const DiffOptions& options, std::ostream& out) {
  out << "  " << (t.equal(options) ? "= " : "! ") << t.path << "  " << dtype_text(t) << "  ";
  if (t.shape_differs()) {
    out << "shape " << shape_str(t.shape_a) << " vs " << shape_str(t.shape_b) << " (values not compared)\n";
    return;
  }
  if (!t.values) {
    out << shape_str(t.shape_a) << "  (values not compared: float4_e2m1fn_x2 packs two values a byte)\n";
    return;
  }
  const ValueStats& v = *t.values;
  out << shape_str(t.shape_a) << "  " << v.mismatched << " of " << v.elements
      << (packed_values(t.dtype_a) == 2 ? " float4 values" : " elements") << " outside tolerance";
  if (v.nonfinite_mismatched) out << " (" << v.nonfinite_mismatched << " NaN/Inf)";
  out << "; max abs diff " << num(v.max_abs_diff);
  if (v.max_abs_at) out << " at " << sample_str(t, *v.max_abs_at);
  out << "; max rel diff " << num(v.max_rel_diff);
  if (v.first_mismatch && v.nonfinite_mismatched) out << "; first mismatch " << sample_str(t, *v.first_mismatch);
  out << "\n";
}

void print_paths(const char* title, const std::vector<std::string>& paths, std::ostream& out) {
  if (paths.empty()) return;
  out << title << " (" << paths.size() << "):\n";
  for (const auto& p : paths) out << "  " << p << "\n";
}

json sample_json(const TensorDiff& t, const ElementSample& s) {
  bool c = any_complex(t);
  auto value = [&](double re, double im) {
    return c ? json::array({number_json(re), number_json(im)}) : number_json(re);
  };
  return {{"index", unravel(s.index, value_shape(t))}, {"a", value(s.a_re, s.a_im)}, {"b", value(s.b_re, s.b_im)}};
}

json tensor_json(const TensorDiff& t, const DiffOptions& options) {
  json j = {{"path", t.path},
            {"equal", t.equal(options)},
            {"dtype", {{"a", std::string(dtype_name(t.dtype_a))}, {"b", std::string(dtype_name(t.dtype_b))}}},
            {"shape", {{"a", t.shape_a}, {"b", t.shape_b}}},
            {"dtype_differs", t.dtype_differs()},
            {"shape_differs", t.shape_differs()}};
  if (!t.values) {
    j["values"] = nullptr;
    return j;
  }
  const ValueStats& v = *t.values;
  j["values"] = {{"elements", v.elements},
                 {"mismatched", v.mismatched},
                 {"nonfinite_mismatched", v.nonfinite_mismatched},
                 {"max_abs_diff", v.max_abs_diff},
                 {"max_rel_diff", v.max_rel_diff},
                 {"max_abs_diff_at", v.max_abs_at ? sample_json(t, *v.max_abs_at) : json(nullptr)},
                 {"first_mismatch", v.first_mismatch ? sample_json(t, *v.first_mismatch) : json(nullptr)}};
  return j;
}

}  // namespace

json number_json(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  return v;
}

namespace {
void print_header(const DiffReport& r, std::ostream& out) {
  const DiffOptions& o = r.options;
  out << "A: " << r.a.source << " (" << r.a.format << ")\n"
      << "B: " << r.b.source << " (" << r.b.format << ")\n"
      << "close: |a - b| <= " << num(o.tolerance.atol) << " + " << num(o.tolerance.rtol) << " * |b|, NaN equals NaN"
      << (o.ignore_dtype ? "; dtype differences ignored" : "") << "\n";
  if (r.bytes_io_as_bytes > 0)
    out << "note: " << r.bytes_io_as_bytes
        << " BytesIO value(s) equal to the bytes on the other side, taken as equal (consolidate writes a BytesIO "
           "as its bytes; --strict counts them as differences)\n";
}
// When tensors differ in dtype (an export cast with --dtype) and the
// comparison asked for identical values, the tolerance that makes "does my
// export match?" answerable: the unit roundoff of the narrower dtype, the
// largest relative change round-to-nearest makes (bf16 2^-8, fp16 2^-11).
std::string dtype_advice(const DiffReport& r) {
  if (r.options.ignore_dtype) return "";
  std::size_t cast = 0;
  int bits = 0;  // the fewest significand bits among the dtypes involved
  for (const auto& t : r.tensors) {
    if (!t.dtype_differs() || !t.values) continue;  // no values compared: nothing a tolerance changes
    ++cast;
    for (DType d : {t.dtype_a, t.dtype_b}) {
      int b = d == DType::kBFloat16 ? 8 : d == DType::kFloat16 ? 11 : d == DType::kFloat32 ? 24 : 0;
      if (b && (!bits || b < bits)) bits = b;
    }
  }
  if (!cast) return "";
  std::string advice = "hint: " + std::to_string(cast) +
                       " tensors differ in dtype; to check that one side is the other cast, compare with "
                       "--ignore-dtype";
  if (bits) {
    char rtol[32];  // exact: a power of two, printed whole so the advice is not a hair too tight
    std::snprintf(rtol, sizeof rtol, "%.12g", std::ldexp(1.0, -bits));
    advice += std::string(" --rtol ") + rtol + " (the rounding of a cast to the narrower dtype)";
  }
  return advice + "\n";
}

}  // namespace

void print_diff_table(const DiffReport& r, std::ostream& out, bool all_tensors) {
  const DiffOptions& o = r.options;
  print_header(r, out);
  print_paths("only in A", r.only_in_a, out);
  print_paths("only in B", r.only_in_b, out);
  if (!r.structure.empty()) {
    out << "structure: " << r.structure.size() << " path(s) reached through other containers or key types\n";
    for (const auto& s : r.structure)
      out << "  ! " << s.path << "  A: " << (s.a.empty() ? "(root)" : s.a) << "  B: " << (s.b.empty() ? "(root)" : s.b)
          << "\n";
  }
  std::size_t differing = r.tensors_differing();
  out << "tensors: " << r.tensors.size() << " compared, " << differing << " differ\n";
  for (const auto& t : r.tensors)
    if (all_tensors || !t.equal(o)) print_tensor(t, o, out);
  out << "values: " << r.values_compared << " compared, " << r.values.size() << " differ\n";
  for (const auto& v : r.values) out << "  ! " << v.path << "  " << v.a.dump() << " vs " << v.b.dump() << "\n";
  out << dtype_advice(r);
  out << (r.equal() ? "equal" : "differ") << "\n";
}

void print_diff_summary(const DiffReport& r, std::ostream& out, std::size_t worst) {
  const DiffOptions& o = r.options;
  print_header(r, out);
  out << "only in A: " << r.only_in_a.size() << ", only in B: " << r.only_in_b.size()
      << ", structure differences: " << r.structure.size() << "\n";
  uint64_t elements = 0, mismatched = 0;
  std::vector<const TensorDiff*> differing;
  for (const auto& t : r.tensors) {
    if (t.values) {
      elements += t.values->elements;
      mismatched += t.values->mismatched;
    }
    if (!t.equal(o)) differing.push_back(&t);
  }
  out << "tensors: " << r.tensors.size() << " compared, " << differing.size() << " differ; elements: " << elements
      << " compared, " << mismatched << " outside tolerance\n";
  auto badness = [](const TensorDiff* t) { return t->values ? t->values->max_abs_diff : HUGE_VAL; };
  std::stable_sort(differing.begin(), differing.end(), [&](const TensorDiff* x, const TensorDiff* y) {
    double bx = badness(x), by = badness(y);
    return bx > by || (std::isnan(bx) && !std::isnan(by));
  });
  if (!differing.empty())
    out << "worst " << std::min(worst, differing.size()) << " of " << differing.size() << " (by max abs diff):\n";
  for (std::size_t i = 0; i < differing.size() && i < worst; ++i) print_tensor(*differing[i], o, out);
  out << "values: " << r.values_compared << " compared, " << r.values.size() << " differ\n";
  out << dtype_advice(r);
  out << (r.equal() ? "equal" : "differ") << "\n";
}

json diff_to_json(const DiffReport& r) {
  const DiffOptions& o = r.options;
  uint64_t elements = 0, mismatched = 0;
  json tensors = json::array();
  for (const auto& t : r.tensors) {
    if (t.values) {
      elements += t.values->elements;
      mismatched += t.values->mismatched;
    }
    tensors.push_back(tensor_json(t, o));
  }
  json values = json::array();
  for (const auto& v : r.values) values.push_back({{"path", v.path}, {"a", v.a}, {"b", v.b}});
  json structure = json::array();
  for (const auto& s : r.structure) structure.push_back({{"path", s.path}, {"a", s.a}, {"b", s.b}});
  return {
      {"schema_version", kDiffSchemaVersion},
      {"a", {{"source", r.a.source}, {"format", r.a.format}}},
      {"b", {{"source", r.b.source}, {"format", r.b.format}}},
      {"tolerance",
       {{"rtol", o.tolerance.rtol}, {"atol", o.tolerance.atol}, {"equal_nan", true}, {"ignore_dtype", o.ignore_dtype}}},
      {"equal", r.equal()},
      {"summary",
       {{"only_in_a", r.only_in_a.size()},
        {"only_in_b", r.only_in_b.size()},
        {"tensors_compared", r.tensors.size()},
        {"tensors_differing", r.tensors_differing()},
        {"bytes_io_as_bytes", r.bytes_io_as_bytes},
        {"values_compared", r.values_compared},
        {"values_differing", r.values.size()},
        {"structure_differing", r.structure.size()},
        {"elements_compared", elements},
        {"elements_mismatched", mismatched}}},
      {"only_in_a", r.only_in_a},
      {"only_in_b", r.only_in_b},
      {"tensors", tensors},
      {"values", values},
      {"structure", structure}};
}

}  // namespace ckpt
