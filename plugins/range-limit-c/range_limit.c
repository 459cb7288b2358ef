/*
 * range-limit in C: the same rule and the same configuration as the Go
 * plugin plugins/range-limit, to show that the ABI (docs/plugin-abi.md) is
 * language-neutral. Freestanding: no libc, no WASI, no allocator; two
 * static buffers and a small JSON scanner.
 *
 *   clang --target=wasm32 -O2 -nostdlib -Wl,--no-entry -Wl,--export-dynamic \
 *         -o range-limit-c.wasm range_limit.c
 *
 * Config: {"param": "rpm", "min": 0, "max": 3000, "clamp": false}
 */

#define EXPORT(name) __attribute__((export_name(name)))
#define IMPORT(mod, name) __attribute__((import_module(mod), import_name(name)))

typedef unsigned int u32;
typedef long long i64;
typedef unsigned long long u64;

IMPORT("edge", "log") void edge_log(int level, const char *msg, int len);

#define IN_CAP (1 << 20)  /* the default MaxInput */
#define OUT_CAP (64 << 10) /* the default MaxOutput */

static char in[IN_CAP];
static char out[OUT_CAP];

/* configuration */
static char param[128];
static int param_len;
static char min_raw[64], max_raw[64];
static int min_len, max_len;
static double min_v, max_v;
static int has_min, has_max, clamp;

static int slen(const char *s) {
  int n = 0;
  while (s[n]) n++;
  return n;
}

static void log_str(int level, const char *s) { edge_log(level, s, slen(s)); }

/* ---- a small JSON scanner over [p, end) ---- */

static const char *ws(const char *p, const char *end) {
  while (p < end && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')) p++;
  return p;
}

/* skip_string: p at the opening quote; returns past the closing one, or 0 */
static const char *skip_string(const char *p, const char *end) {
  p++;
  while (p < end) {
    if (*p == '\\') {
      p += 2;
      continue;
    }
    if (*p == '"') return p + 1;
    if ((unsigned char)*p < 0x20) return 0;
    p++;
  }
  return 0;
}

/* skip_value: returns past one value, or 0 if malformed */
static const char *skip_value(const char *p, const char *end, int depth) {
  if (p >= end || depth > 256) return 0;
  char c = *p;
  if (c == '"') return skip_string(p, end);
  if (c == '{' || c == '[') {
    char close = c == '{' ? '}' : ']';
    p = ws(p + 1, end);
    if (p < end && *p == close) return p + 1;
    for (;;) {
      if (c == '{') {
        if (p >= end || *p != '"') return 0;
        p = skip_string(p, end);
        if (!p) return 0;
        p = ws(p, end);
        if (p >= end || *p != ':') return 0;
        p = ws(p + 1, end);
      }
      p = skip_value(p, end, depth + 1);
      if (!p) return 0;
      p = ws(p, end);
      if (p < end && *p == close) return p + 1;
      if (p >= end || *p != ',') return 0;
      p = ws(p + 1, end);
    }
  }
  const char *start = p;
  while (p < end && (*p == '-' || *p == '+' || *p == '.' || *p == 'e' || *p == 'E' ||
                     (*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'z')))
    p++;
  return p > start ? p : 0;
}

/* find: in the object [obj, end), the value of key (unescaped keys only);
 * sets *vend; returns 0 when absent or malformed */
static const char *find(const char *obj, const char *end, const char *key, int klen,
                        const char **vend) {
  const char *p = ws(obj, end);
  if (p >= end || *p != '{') return 0;
  p = ws(p + 1, end);
  if (p < end && *p == '}') return 0;
  for (;;) {
    if (p >= end || *p != '"') return 0;
    const char *ks = p + 1;
    p = skip_string(p, end);
    if (!p) return 0;
    int match = (p - 1 - ks) == klen;
    for (int i = 0; match && i < klen; i++) match = ks[i] == key[i];
    p = ws(p, end);
    if (p >= end || *p != ':') return 0;
    p = ws(p + 1, end);
    const char *v = p;
    p = skip_value(p, end, 0);
    if (!p) return 0;
    if (match) {
      *vend = p;
      return v;
    }
    p = ws(p, end);
    if (p < end && *p == '}') return 0;
    if (p >= end || *p != ',') return 0;
    p = ws(p + 1, end);
  }
}

static const double pow10[] = {1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,
                               1e8,  1e9,  1e10, 1e11, 1e12, 1e13, 1e14, 1e15,
                               1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};

/* number: parses a JSON number. Exact (correctly rounded) when the digits
 * fit in 2^53 and the exponent in 1e22, as for any realistic parameter;
 * close otherwise. Returns 0 if [p, end) is not a number. */
static int number(const char *p, const char *end, double *out_v) {
  int neg = 0, digits = 0, exp = 0;
  u64 mant = 0;
  if (p < end && *p == '-') neg = 1, p++;
  if (p >= end || *p < '0' || *p > '9') return 0;
  for (; p < end && *p >= '0' && *p <= '9'; p++, digits++) {
    if (mant < (1ULL << 53) / 10) mant = mant * 10 + (u64)(*p - '0');
    else exp++;
  }
  if (p < end && *p == '.') {
    p++;
    if (p >= end || *p < '0' || *p > '9') return 0;
    for (; p < end && *p >= '0' && *p <= '9'; p++) {
      if (mant < (1ULL << 53) / 10) mant = mant * 10 + (u64)(*p - '0'), exp--;
    }
  }
  if (p < end && (*p == 'e' || *p == 'E')) {
    int eneg = 0, e = 0;
    p++;
    if (p < end && (*p == '+' || *p == '-')) eneg = *p == '-', p++;
    if (p >= end || *p < '0' || *p > '9') return 0;
    for (; p < end && *p >= '0' && *p <= '9'; p++)
      if (e < 10000) e = e * 10 + (*p - '0');
    exp += eneg ? -e : e;
  }
  if (p != end) return 0;
  double v = (double)mant;
  while (exp > 22) v *= 1e22, exp -= 22;
  while (exp < -22) v /= 1e22, exp += 22;
  v = exp >= 0 ? v * pow10[exp] : v / pow10[-exp];
  *out_v = neg ? -v : v;
  return 1;
}

static int copy_raw(char *dst, int cap, const char *s, const char *e) {
  int n = (int)(e - s);
  if (n >= cap) return -1;
  for (int i = 0; i < n; i++) dst[i] = s[i];
  return n;
}

/* ---- the ABI ---- */

EXPORT("policy_abi_version") int policy_abi_version(void) { return 1; }

EXPORT("policy_buffer") char *policy_buffer(int size) {
  return size >= 0 && size <= IN_CAP ? in : 0;
}

static int only_keys(const char *p, const char *end) {
  static const char *known[] = {"param", "min", "max", "clamp"};
  p = ws(p, end);
  if (p >= end || *p != '{') return 0;
  p = ws(p + 1, end);
  if (p < end && *p == '}') return 1;
  for (;;) {
    if (p >= end || *p != '"') return 0;
    const char *ks = p + 1;
    p = skip_string(p, end);
    if (!p) return 0;
    int klen = (int)(p - 1 - ks), ok = 0;
    for (int k = 0; k < 4 && !ok; k++) {
      int n = slen(known[k]);
      ok = n == klen;
      for (int i = 0; ok && i < n; i++) ok = ks[i] == known[k][i];
    }
    if (!ok) {
      log_str(3, "range-limit: unknown key in policy.config");
      return 0;
    }
    p = ws(p, end);
    if (p >= end || *p != ':') return 0;
    p = skip_value(ws(p + 1, end), end, 0);
    if (!p) return 0;
    p = ws(p, end);
    if (p < end && *p == '}') return 1;
    if (p >= end || *p != ',') return 0;
    p = ws(p + 1, end);
  }
}

EXPORT("policy_init") int policy_init(int len) {
  const char *end = in + len, *ve;
  if (len < 0 || len > IN_CAP || !only_keys(in, end)) return 1;
  const char *v = find(in, end, "param", 5, &ve);
  if (!v || *v != '"' || ve - v < 3) {
    log_str(3, "range-limit: \"param\" must be a non-empty string");
    return 1;
  }
  for (const char *q = v + 1; q < ve - 1; q++)
    if (*q == '\\') {
      log_str(3, "range-limit: \"param\" must not contain escapes");
      return 1;
    }
  if ((param_len = copy_raw(param, sizeof param, v + 1, ve - 1)) < 0) return 1;
  if ((v = find(in, end, "min", 3, &ve))) {
    if (!number(v, ve, &min_v) || (min_len = copy_raw(min_raw, sizeof min_raw, v, ve)) < 0) {
      log_str(3, "range-limit: \"min\" must be a number");
      return 1;
    }
    has_min = 1;
  }
  if ((v = find(in, end, "max", 3, &ve))) {
    if (!number(v, ve, &max_v) || (max_len = copy_raw(max_raw, sizeof max_raw, v, ve)) < 0) {
      log_str(3, "range-limit: \"max\" must be a number");
      return 1;
    }
    has_max = 1;
  }
  if (!has_min && !has_max) {
    log_str(3, "range-limit: \"min\" or \"max\" is required");
    return 1;
  }
  if (has_min && has_max && min_v > max_v) {
    log_str(3, "range-limit: \"min\" is above \"max\"");
    return 1;
  }
  if ((v = find(in, end, "clamp", 5, &ve))) {
    if (ve - v == 4 && v[0] == 't') clamp = 1;
    else if (ve - v == 5 && v[0] == 'f') clamp = 0;
    else {
      log_str(3, "range-limit: \"clamp\" must be a boolean");
      return 1;
    }
  }
  return 0;
}

static int o; /* output length */

static void put(const char *s, int n) {
  for (int i = 0; i < n && o < OUT_CAP; i++) out[o++] = s[i];
}
static void puts_(const char *s) { put(s, slen(s)); }

static i64 result(void) { return ((i64)(u32)out << 32) | (i64)o; }

static i64 deny(const char *v, const char *ve, const char *what, const char *bound, int blen) {
  o = 0;
  puts_("{\"allow\":false,\"reason\":\"");
  put(param, param_len);
  puts_(" ");
  put(v, (int)(ve - v));
  puts_(what);
  put(bound, blen);
  puts_("\"}");
  return result();
}

/* rewrite: the params object [ps, pe) with the value [v, ve) replaced */
static i64 rewrite(const char *ps, const char *pe, const char *v, const char *ve,
                   const char *bound, int blen) {
  o = 0;
  puts_("{\"allow\":true,\"params\":");
  put(ps, (int)(v - ps));
  put(bound, blen);
  put(ve, (int)(pe - ve));
  puts_("}");
  return result();
}

EXPORT("policy_eval") i64 policy_eval(int len) {
  if (len < 0 || len > IN_CAP) return -1;
  const char *end = in + len, *ce, *pe, *ve;
  const char *cmd = find(in, end, "command", 7, &ce);
  if (!cmd) return -1;
  const char *params = find(cmd, ce, "params", 6, &pe);
  if (!params || *params != '{') return -1;
  const char *v = find(params, pe, param, param_len, &ve);
  o = 0;
  if (!v) {
    puts_("{\"allow\":true}");
    return result();
  }
  double x;
  if (!number(v, ve, &x)) {
    puts_("{\"allow\":false,\"reason\":\"");
    put(param, param_len);
    puts_(" is not a number\"}");
    return result();
  }
  if (has_max && x > max_v) {
    if (clamp) return rewrite(params, pe, v, ve, max_raw, max_len);
    return deny(v, ve, " above max ", max_raw, max_len);
  }
  if (has_min && x < min_v) {
    if (clamp) return rewrite(params, pe, v, ve, min_raw, min_len);
    return deny(v, ve, " below min ", min_raw, min_len);
  }
  puts_("{\"allow\":true}");
  return result();
}
