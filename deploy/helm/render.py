"""A renderer of the Go-template subset the pscluster chart uses, for tests on machines without
the helm binary: text/template actions (define, include, if / else if / else, with, range,
variables, pipelines, parentheses, comments, {{- -}} trimming) and the Sprig/Helm functions the
chart calls (default, printf, trunc, trimSuffix, quote, int, gt, lt, eq, ne, not, and, or, list,
index, indent, nindent, toYaml). Anything else raises, so a template using more fails loudly.

    render_chart(chart_dir, overrides) -> {template name: rendered text}
"""
import copy
import os
import re

import yaml

_ACTION = re.compile(r"\{\{(-?)(\s*/\*.*?\*/\s*|.*?)(-?)\}\}", re.S)


class TemplateError(Exception):
    pass


def _tokenize(text):
    """[('text', s) | ('action', s)] with the trim markers applied."""
    out, pos = [], 0
    for m in _ACTION.finditer(text):
        before = text[pos:m.start()]
        if m.group(1):
            before = before.rstrip(" \t\r\n")
        out.append(("text", before))
        body = m.group(2).strip()
        if not body.startswith("/*"):
            out.append(("action", body))
        pos = m.end()
        if m.group(3):
            while pos < len(text) and text[pos] in " \t\r\n":
                pos += 1
    out.append(("text", text[pos:]))
    return out


def _parse(tokens, i=0, stop=("end",)):
    """A list of nodes up to one of `stop` (returned with the stopping action)."""
    nodes = []
    while i < len(tokens):
        kind, s = tokens[i]
        if kind == "text":
            if s:
                nodes.append(("text", s))
            i += 1
            continue
        word = s.split(None, 1)[0] if s else ""
        if word in stop or (word == "else" and "else" in stop):
            return nodes, i, s
        if word in ("if", "with", "range"):
            cond = s[len(word):].strip()
            branches, cur_cond = [], cond
            i += 1
            while True:
                body, i, ender = _parse(tokens, i, ("end", "else"))
                branches.append((cur_cond, body))
                i += 1
                if ender == "end":
                    break
                rest = ender[4:].strip()
                if rest.startswith("if "):
                    cur_cond = rest[3:].strip()
                elif rest == "":
                    cur_cond = None
                else:
                    raise TemplateError(f"unsupported else: {ender}")
            nodes.append((word, branches))
            continue
        if word == "define":
            name = _string(s[len("define"):].strip())
            body, i, _ = _parse(tokens, i + 1, ("end",))
            nodes.append(("define", name, body))
            i += 1
            continue
        if word == "end":
            raise TemplateError("unexpected end")
        nodes.append(("expr", s))
        i += 1
    return nodes, i, None


def _string(tok):
    if tok.startswith('"') and tok.endswith('"'):
        return bytes(tok[1:-1], "utf-8").decode("unicode_escape")
    raise TemplateError(f"expected a string: {tok}")


def _lex_expr(s):
    toks, i = [], 0
    while i < len(s):
        c = s[i]
        if c.isspace():
            i += 1
        elif c in "()|":
            toks.append(c)
            i += 1
        elif c == '"':
            j = i + 1
            while s[j] != '"':
                j += 2 if s[j] == "\\" else 1
            toks.append(s[i:j + 1])
            i = j + 1
        elif s.startswith(":=", i):
            toks.append(":=")
            i += 2
        else:
            j = i
            while j < len(s) and not s[j].isspace() and s[j] not in "()|":
                j += 1
            toks.append(s[i:j])
            i = j
    return toks


def truthy(v):
    return not (v is None or v is False or v == 0 or v == "" or v == [] or v == {})


def _go_printf(fmt, *args):
    py = re.sub(r"%v", "%s", fmt)
    return py % tuple(args)


def _to_yaml(v):
    if v is None:
        return "null"
    return yaml.safe_dump(v, default_flow_style=False, sort_keys=True).rstrip("\n")


def _indent(n, s):
    return "\n".join(" " * n + line for line in str(s).split("\n"))


class Renderer:
    def __init__(self, defines):
        self.defines = defines

    def funcs(self):
        return {
            "default": lambda d, v=None: v if truthy(v) else d,
            "printf": _go_printf,
            "trunc": lambda n, s: s[:n],
            "trimSuffix": lambda suf, s: s[:-len(suf)] if suf and s.endswith(suf) else s,
            "quote": lambda *a: " ".join('"%s"' % str(x).replace("\\", "\\\\").replace('"', '\\"')
                                         for x in a),
            "int": lambda v: int(v or 0),
            "gt": lambda a, b: a > b,
            "lt": lambda a, b: a < b,
            "eq": lambda a, b: a == b,
            "ne": lambda a, b: a != b,
            "not": lambda v: not truthy(v),
            "and": lambda *a: next((x for x in a if not truthy(x)), a[-1]),
            "or": lambda *a: next((x for x in a if truthy(x)), a[-1]),
            "list": lambda *a: list(a),
            "index": lambda c, *k: _index(c, k),
            "indent": lambda n, s: _indent(n, s),
            "nindent": lambda n, s: "\n" + _indent(n, s),
            "toYaml": _to_yaml,
            "include": self.include,
        }

    def include(self, name, dot):
        if name not in self.defines:
            raise TemplateError(f"no template {name}")
        return self.run(self.defines[name], dot, {"$": dot})

    def run(self, nodes, dot, scope):
        out = []
        for n in nodes:
            kind = n[0]
            if kind == "text":
                out.append(n[1])
            elif kind == "define":
                continue
            elif kind == "expr":
                v = self.expr(n[1], dot, scope)
                if v is not None and not (isinstance(n[1], str) and ":=" in n[1]):
                    out.append(_fmt(v))
            elif kind in ("if", "with"):
                for cond, body in n[1]:
                    if cond is None:
                        out.append(self.run(body, dot, dict(scope)))
                        break
                    v = self.expr(cond, dot, scope)
                    if truthy(v):
                        out.append(self.run(body, v if kind == "with" else dot, dict(scope)))
                        break
            elif kind == "range":
                cond, body = n[1][0]
                items = self.expr(cond, dot, scope) or []
                if len(n[1]) > 1:
                    raise TemplateError("range/else not supported")
                for item in (items.values() if isinstance(items, dict) else items):
                    out.append(self.run(body, item, dict(scope)))
        return "".join(out)

    def expr(self, s, dot, scope):
        toks = _lex_expr(s)
        if len(toks) >= 3 and toks[1] == ":=":
            scope[toks[0]] = self.pipeline(toks[2:], dot, scope)
            return None
        return self.pipeline(toks, dot, scope)

    def pipeline(self, toks, dot, scope):
        cmds, cur, depth = [], [], 0
        for t in toks:
            if t == "(":
                depth += 1
            elif t == ")":
                depth -= 1
            if t == "|" and depth == 0:
                cmds.append(cur)
                cur = []
            else:
                cur.append(t)
        cmds.append(cur)
        value, first = None, True
        for cmd in cmds:
            args = self.args(cmd, dot, scope)
            if not first:
                args.append(("value", value))
            value = self.call(args)
            first = False
        return value

    def args(self, toks, dot, scope):
        out, i = [], 0
        while i < len(toks):
            t = toks[i]
            if t == "(":
                depth, j = 1, i + 1
                while depth:
                    depth += {"(": 1, ")": -1}.get(toks[j], 0)
                    j += 1
                out.append(("value", self.pipeline(toks[i + 1:j - 1], dot, scope)))
                i = j
                continue
            out.append(self.term(t, dot, scope))
            i += 1
        return out

    def term(self, t, dot, scope):
        if t.startswith('"'):
            return ("value", _string(t))
        if re.fullmatch(r"-?\d+", t):
            return ("value", int(t))
        if t in ("true", "false"):
            return ("value", t == "true")
        if t == ".":
            return ("value", dot)
        if t.startswith("."):
            return ("value", _field(dot, t[1:].split(".")))
        if t.startswith("$"):
            name, _, rest = t.partition(".")
            if name not in scope:
                raise TemplateError(f"undefined variable {name}")
            return ("value", _field(scope[name], rest.split(".")) if rest else scope[name])
        if t in self.funcs():
            return ("func", t)
        raise TemplateError(f"unknown function or term {t}")

    def call(self, args):
        if not args:
            raise TemplateError("empty command")
        kind, v = args[0]
        if kind == "func":
            return self.funcs()[v](*[a[1] for a in args[1:]])
        if len(args) > 1:
            raise TemplateError(f"a value cannot take arguments: {args}")
        return v


def _index(c, keys):
    for k in keys:
        c = c[k]
    return c


def _field(v, path):
    for p in path:
        if p == "":
            continue
        if isinstance(v, dict):
            v = v.get(p)
        else:
            return None
    return v


def _fmt(v):
    if v is True:
        return "true"
    if v is False:
        return "false"
    if v is None:
        return "<no value>"
    return str(v)


def merge(base, over):
    out = copy.deepcopy(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = merge(out[k], v)
        else:
            out[k] = v
    return out


def render_chart(chart_dir, overrides=None, release="ps", namespace="pscluster"):
    def read(*path):
        with open(os.path.join(chart_dir, *path)) as f:
            return f.read()
    chart = yaml.safe_load(read("Chart.yaml"))
    values = merge(yaml.safe_load(read("values.yaml")), overrides or {})
    tdir = os.path.join(chart_dir, "templates")
    parsed, defines = {}, {}
    for name in sorted(os.listdir(tdir)):
        nodes, _, _ = _parse(_tokenize(read("templates", name)))
        for n in nodes:
            if n[0] == "define":
                defines[n[1]] = n[2]
        parsed[name] = nodes
    dot = {
        "Values": values,
        "Release": {"Name": release, "Namespace": namespace, "Service": "Helm"},
        "Chart": {"Name": chart["name"], "Version": chart["version"],
                  "AppVersion": chart["appVersion"]},
    }
    r = Renderer(defines)
    return {name: r.run(nodes, dot, {"$": dot})
            for name, nodes in parsed.items() if not name.startswith("_")}
