#!/usr/bin/env python3
"""Generates the tables of upstream argument definitions that trainscope's export is checked
against (issue #14), from the upstream source, without importing it (stdlib only, `ast`).

  megatron-lm: every argument of Megatron-LM's parser (megatron/training/arguments.py): the
      explicit add_argument() calls, and the arguments ArgumentGroupFactory derives from config
      dataclasses (TransformerConfig, TrainingConfig, ...) by the factory's rules (bool ->
      store_true, or --no-x/--disable-x when the default is True; Optional[X] -> X;
      list[X] -> nargs '+'; Literal -> choices; Enum -> member names; metadata
      "argparse_meta" wins).
  bridge: every field of Megatron-Bridge's ConfigContainer, as dotted override paths
      (model.tensor_model_parallel_size, ddp.overlap_grad_reduce, ...) with their type.

Usage:
  scripts/megatron_tables.py megatron-lm SRC > resources/megatron/megatron_lm_args.tsv
  scripts/megatron_tables.py bridge SRC [--megatron-lm SRC] > resources/megatron/bridge_fields.tsv
SRC is a checkout, or a git directory (bare clones work): files are read with `git show`.
"""

import argparse
import ast
import json
import os
import subprocess
import sys


class Source:
    """Files of one upstream repository at one commit."""

    def __init__(self, path):
        self.path = path
        self.git = os.path.isdir(os.path.join(path, "objects")) or os.path.isdir(os.path.join(path, ".git"))
        gitdir = path if os.path.isdir(os.path.join(path, "objects")) else os.path.join(path, ".git")
        self.gitdir = gitdir if self.git else None
        self.commit = self._run(["rev-parse", "HEAD"]).strip() if self.git else "unknown"
        self._cache = {}

    def _run(self, args):
        return subprocess.run(["git", "--git-dir", self.gitdir] + args, check=True, capture_output=True,
                              text=True).stdout

    def read(self, rel):
        if rel in self._cache:
            return self._cache[rel]
        text = None
        if self.git:
            try:
                text = self._run(["show", "HEAD:" + rel])
            except subprocess.CalledProcessError:
                text = None
        else:
            p = os.path.join(self.path, rel)
            if os.path.isfile(p):
                with open(p, encoding="utf-8") as f:
                    text = f.read()
        self._cache[rel] = text
        return text

    def module(self, dotted):
        """(path, ast.Module) of a dotted module name, or (None, None)."""
        base = dotted.replace(".", "/")
        for rel in (base + ".py", base + "/__init__.py", "src/" + base + ".py", "src/" + base + "/__init__.py"):
            text = self.read(rel)
            if text is not None:
                return rel, ast.parse(text)
        return None, None


def imports_of(tree, module_name, is_pkg=False):
    """name -> (module, original name) for the `from X import Y` statements of a module
    (relative imports resolved against module_name; a package's __init__ is its own base)."""
    out = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            mod = node.module or ""
            if node.level:
                parts = module_name.split(".")
                pkg = parts[: len(parts) - node.level + (1 if is_pkg else 0)]
                mod = ".".join(pkg + ([mod] if mod else []))
            for a in node.names:
                out[a.asname or a.name] = (mod, a.name)
    return out


class Resolver:
    """Finds class definitions across modules by following `from X import Y`."""

    def __init__(self, sources):
        self.sources = sources

    def is_pkg(self, module):
        for src in self.sources:
            rel, _ = src.module(module)
            if rel:
                return rel.endswith("__init__.py")
        return False

    def find_class(self, module, name, depth=0):
        if depth > 8:
            return None
        for src in self.sources:
            rel, tree = src.module(module)
            if tree is None:
                continue
            for node in tree.body:
                if isinstance(node, ast.ClassDef) and node.name == name:
                    return (module, tree, node)
            imp = imports_of(tree, module, rel.endswith("__init__.py"))
            if name in imp:
                mod, orig = imp[name]
                found = self.find_class(mod, orig, depth + 1)
                if found:
                    return found
        return None

    def class_in_scope(self, module, tree, name):
        for node in tree.body:
            if isinstance(node, ast.ClassDef) and node.name == name:
                return (module, tree, node)
        imp = imports_of(tree, module, self.is_pkg(module))
        if name in imp:
            return self.find_class(*imp[name])
        return None


def literal(node):
    """A Python value for a constant expression, else its source text marked with '<expr>'."""
    if node is None:
        return None
    try:
        return ast.literal_eval(node)
    except Exception:
        return {"expr": ast.unparse(node)}


def type_text(node):
    if node is None:
        return ""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return ast.unparse(node)
    return ast.unparse(node)


def json_text(v):
    if isinstance(v, dict) and set(v) == {"expr"}:
        return "<" + v["expr"] + ">"
    try:
        return json.dumps(v)
    except TypeError:
        return json.dumps(repr(v))


def is_enum_class(resolver, found):
    if not found:
        return False
    _, _, cls = found
    return any(type_text(b).split(".")[-1] in ("Enum", "IntEnum", "StrEnum") for b in cls.bases)


def enum_members(found):
    _, _, cls = found
    names = []
    for st in cls.body:
        if isinstance(st, ast.Assign) and isinstance(st.targets[0], ast.Name) and not st.targets[0].id.startswith("_"):
            names.append(st.targets[0].id)
    return names


def strip_optional(ann):
    """Optional[X] / Union[X, None] / X | None -> X; else ann."""
    if isinstance(ann, ast.Subscript) and type_text(ann.value).split(".")[-1] == "Optional":
        return ann.slice
    if isinstance(ann, ast.Subscript) and type_text(ann.value).split(".")[-1] == "Union":
        elts = ann.slice.elts if isinstance(ann.slice, ast.Tuple) else [ann.slice]
        rest = [e for e in elts if not (isinstance(e, ast.Constant) and e.value is None)]
        if len(rest) == 1 and len(elts) == 2:
            return rest[0]
        return ann
    if isinstance(ann, ast.BinOp) and isinstance(ann.op, ast.BitOr):
        if isinstance(ann.right, ast.Constant) and ann.right.value is None:
            return ann.left
    return ann


def dataclass_fields(resolver, module, tree, cls, seen=None):
    """Fields of a dataclass in definition order, base classes first:
    (name, annotation node, default node, default_factory node, metadata node, init)."""
    seen = seen or set()
    out = []
    for b in cls.bases:
        bname = type_text(b)
        if bname in ("object",) or bname in seen:
            continue
        found = resolver.class_in_scope(module, tree, bname.split(".")[-1])
        if found:
            seen.add(bname)
            out.extend(dataclass_fields(resolver, *found, seen=seen))
    own = []
    for st in cls.body:
        if not (isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name)):
            continue
        ann_text = type_text(st.annotation)
        if ann_text.startswith("ClassVar") or ann_text.startswith("typing.ClassVar") or ann_text == "InitVar":
            continue
        default = st.value
        factory = None
        metadata = None
        init = True
        if isinstance(st.value, ast.Call) and type_text(st.value.func).split(".")[-1] == "field":
            default = None
            for kw in st.value.keywords:
                if kw.arg == "default":
                    default = kw.value
                elif kw.arg == "default_factory":
                    factory = kw.value
                elif kw.arg == "metadata":
                    metadata = kw.value
                elif kw.arg == "init":
                    init = literal(kw.value) is not False
        own.append((st.target.id, st.annotation, default, factory, metadata, init))
    names = {f[0] for f in own}
    return [f for f in out if f[0] not in names] + own


def factory_default(default, factory):
    if factory is not None:
        t = type_text(factory)
        if t in ("list", "dict", "set", "tuple"):
            return {"list": [], "dict": {}, "set": [], "tuple": []}[t]
        if isinstance(factory, ast.Lambda):
            return literal(factory.body)
        return {"expr": t + "()"}
    return literal(default)


def factory_arguments(resolver, module, tree, cls, exclude):
    """The add_argument() keyword sets ArgumentGroupFactory builds for a dataclass."""
    rows = []
    for name, ann, default, factory, metadata, init in dataclass_fields(resolver, module, tree, cls):
        if name in exclude or not init:
            continue
        row = {"flags": ["--" + name.replace("_", "-")], "dest": name, "default": factory_default(default, factory),
               "type": "", "nargs": "", "choices": None, "action": "store"}
        inner = strip_optional(ann)
        if isinstance(inner, ast.Subscript) and type_text(inner.value).split(".")[-1] in ("list", "List"):
            row["nargs"] = "+"
            inner = strip_optional(inner.slice)
        if isinstance(inner, ast.Subscript) and type_text(inner.value).split(".")[-1] == "Literal":
            elts = inner.slice.elts if isinstance(inner.slice, ast.Tuple) else [inner.slice]
            values = [literal(e) for e in elts]
            row["choices"] = values
            row["type"] = type(values[0]).__name__ if values else "str"
        elif isinstance(inner, (ast.Name, ast.Attribute)):
            t = type_text(inner)
            if t in ("int", "float", "str", "bool"):
                row["type"] = t
            else:
                found = resolver.class_in_scope(module, tree, t.split(".")[-1])
                if is_enum_class(resolver, found):
                    row["type"] = "enum"
                    row["choices"] = enum_members(found)
                    d = row["default"]
                    if isinstance(d, dict) and "expr" in d and "." in d["expr"]:
                        row["default"] = d["expr"].split(".")[-1]
                else:
                    row["type"] = "unsupported:" + t
        else:
            row["type"] = "unsupported:" + type_text(inner)
        if row["type"] == "bool":
            row["type"] = ""
            if row["default"] is False:
                row["action"] = "store_true"
            else:
                row["action"] = "store_false"
                row["flags"] = ["--no-" + name.replace("_", "-"), "--disable-" + name.replace("_", "-")]
        meta = literal(metadata) if metadata is not None else None
        if metadata is not None and isinstance(metadata, ast.Dict):
            for k, v in zip(metadata.keys, metadata.values):
                if literal(k) == "argparse_meta" and isinstance(v, ast.Dict):
                    for mk, mv in zip(v.keys, v.values):
                        key = literal(mk)
                        if key == "arg_names":
                            row["flags"] = literal(mv)
                        elif key == "type":
                            row["type"] = type_text(mv)
                        elif key in ("nargs", "choices", "default", "action", "dest"):
                            row[key] = literal(mv)
        del meta
        rows.append(row)
    return rows


def explicit_argument(call):
    flags = [a.value for a in call.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
    row = {"flags": flags, "dest": None, "default": None, "type": "", "nargs": "", "choices": None, "action": "store"}
    has_default = False
    for kw in call.keywords:
        if kw.arg == "dest":
            row["dest"] = literal(kw.value)
        elif kw.arg == "default":
            row["default"] = literal(kw.value)
            has_default = True
        elif kw.arg == "type":
            row["type"] = type_text(kw.value)
        elif kw.arg == "nargs":
            row["nargs"] = literal(kw.value)
        elif kw.arg == "choices":
            row["choices"] = literal(kw.value)
        elif kw.arg == "action":
            row["action"] = literal(kw.value) if isinstance(kw.value, ast.Constant) else type_text(kw.value)
    if row["dest"] is None:
        longs = [f for f in flags if f.startswith("--")]
        row["dest"] = (longs[0] if longs else flags[0] if flags else "?").lstrip("-").replace("-", "_")
    if not has_default and row["action"] == "store_true":
        row["default"] = False
    if not has_default and row["action"] == "store_false":
        row["default"] = True
    return row


def megatron_lm_rows(src):
    resolver = Resolver([src])
    module = "megatron.training.arguments"
    rel, tree = src.module(module)
    if tree is None:
        sys.exit("megatron/training/arguments.py not found in " + src.path)
    rows = []
    top_imports = imports_of(tree, module)
    for fn in [n for n in tree.body if isinstance(n, ast.FunctionDef)]:
        local_lists = {}
        for node in ast.walk(fn):
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                if isinstance(node.value, ast.List):
                    local_lists[node.targets[0].id] = [literal(e) for e in node.value.elts]
        calls = sorted((n for n in ast.walk(fn) if isinstance(n, ast.Call)), key=lambda n: (n.lineno, n.col_offset))
        for call in calls:
            fname = type_text(call.func)
            if fname.endswith(".add_argument"):
                rows.append(explicit_argument(call))
            elif fname.split(".")[-1] == "ArgumentGroupFactory" and call.args:
                cls_name = type_text(call.args[0])
                exclude = []
                for kw in call.keywords:
                    if kw.arg == "exclude":
                        if isinstance(kw.value, ast.Name):
                            exclude = local_lists.get(kw.value.id, [])
                        else:
                            exclude = literal(kw.value) or []
                found = None
                fn_imports = imports_of(fn, module)
                if cls_name in fn_imports:
                    found = resolver.find_class(*fn_imports[cls_name])
                elif cls_name in top_imports:
                    found = resolver.find_class(*top_imports[cls_name])
                if not found:
                    sys.exit("cannot find the dataclass " + cls_name)
                rows.extend(factory_arguments(resolver, *found, set(exclude)))
    return rows


def write_args_table(src, rows, out):
    out.write("# Megatron-LM argument definitions, generated by scripts/megatron_tables.py from\n")
    out.write("# megatron/training/arguments.py and the config dataclasses its ArgumentGroupFactory reads.\n")
    out.write("# upstream\tNVIDIA/Megatron-LM\t%s\n" % src.commit)
    out.write("# columns: flags (comma-separated)\tdest\ttype\tnargs\tchoices (JSON)\tdefault (JSON; <expr> when computed)\taction\n")
    for r in rows:
        if not r["flags"]:
            continue
        choices = "" if r["choices"] is None else json_text(r["choices"])
        out.write("\t".join([",".join(r["flags"]), str(r["dest"]), r["type"] or "", str(r["nargs"] or ""), choices,
                             json_text(r["default"]), str(r["action"])]) + "\n")


# ---- Megatron-Bridge ------------------------------------------------------------------------

# ConfigContainer sections and the dataclass that types each, as Bridge declares them in
# src/megatron/bridge/training/config.py (read from the source below; this only names the root).
BRIDGE_ROOT = ("megatron.bridge.training.config", "ConfigContainer")


def union_members(ann):
    """The members of X | Y | None, Union[X, Y], Optional[X] (None left out)."""
    if isinstance(ann, ast.BinOp) and isinstance(ann.op, ast.BitOr):
        return union_members(ann.left) + union_members(ann.right)
    if isinstance(ann, ast.Subscript) and type_text(ann.value).split(".")[-1] in ("Union", "Optional"):
        elts = ann.slice.elts if isinstance(ann.slice, ast.Tuple) else [ann.slice]
        out = []
        for e in elts:
            out.extend(union_members(e))
        return out
    if isinstance(ann, ast.Constant) and ann.value is None:
        return []
    return [ann]


def annotation_class(resolver, module, tree, ann):
    """The first dataclass among the annotation's members (GPTDatasetConfig of a dataset
    union, MixedPrecisionConfig of Optional[Union[MixedPrecisionConfig, str]])."""
    for m in union_members(ann):
        if isinstance(m, (ast.Name, ast.Attribute)):
            t = type_text(m)
            found = resolver.class_in_scope(module, tree, t.split(".")[-1])
            if found and not is_enum_class(resolver, found):
                return found
    return None


def bridge_rows(resolver, module, tree, cls, prefix, depth, out, seen):
    for name, ann, default, factory, metadata, init in dataclass_fields(resolver, module, tree, cls):
        if name.startswith("_"):
            continue
        path = prefix + name
        sub = annotation_class(resolver, module, tree, ann) if depth < 3 else None
        if sub and (sub[2].name not in seen):
            bridge_rows(resolver, *sub, path + ".", depth + 1, out, seen | {sub[2].name})
            # A union that also takes a plain value (mixed_precision: a preset name) keeps
            # a row for the path itself.
            plain = [type_text(m) for m in union_members(ann) if type_text(m) in ("str", "int", "float", "bool")]
            if plain:
                out.append((path, plain[0], "optional", "", json_text(factory_default(default, factory))))
            continue
        inner = strip_optional(ann)
        kind = type_text(inner)
        choices = None
        if isinstance(inner, ast.Subscript) and type_text(inner.value).split(".")[-1] == "Literal":
            elts = inner.slice.elts if isinstance(inner.slice, ast.Tuple) else [inner.slice]
            choices = [literal(e) for e in elts]
            kind = type(choices[0]).__name__ if choices else "str"
        elif isinstance(inner, (ast.Name, ast.Attribute)):
            found = resolver.class_in_scope(module, tree, kind.split(".")[-1])
            if is_enum_class(resolver, found):
                choices = enum_members(found)
                kind = "enum"
        optional = strip_optional(ann) is not ann
        out.append((path, kind, "optional" if optional else "", "" if choices is None else json_text(choices),
                    json_text(factory_default(default, factory))))


def bridge_table(bridge, mlm, out):
    sources = [bridge] + ([mlm] if mlm else [])
    resolver = Resolver(sources)
    root = resolver.find_class(*BRIDGE_ROOT)
    if not root:
        sys.exit("ConfigContainer not found in " + bridge.path)
    rows = []
    bridge_rows(resolver, *root, "", 0, rows, {root[2].name})
    # The model section is typed by a base class in ConfigContainer; recipes for GPT models put
    # a GPTModelProvider there, whose fields (TransformerConfig's included) are the model.* paths.
    gpt = resolver.find_class("megatron.bridge.models.gpt_provider", "GPTModelProvider")
    if gpt:
        rows = [r for r in rows if not r[0].startswith("model.")]
        model_rows = []
        bridge_rows(resolver, *gpt, "model.", 1, model_rows, {gpt[2].name})
        rows.extend(model_rows)
    out.write("# Megatron-Bridge ConfigContainer fields (override paths), generated by scripts/megatron_tables.py\n")
    out.write("# from src/megatron/bridge/training/config.py, models/gpt_provider.py and Megatron-Core's configs.\n")
    out.write("# upstream\tNVIDIA-NeMo/Megatron-Bridge\t%s\n" % bridge.commit)
    if mlm:
        out.write("# upstream\tNVIDIA/Megatron-LM\t%s\n" % mlm.commit)
    out.write("# columns: path\ttype\toptional\tchoices (JSON)\tdefault (JSON; <expr> when computed)\n")
    seen = set()
    for r in rows:
        if r[0] in seen:
            continue
        seen.add(r[0])
        out.write("\t".join(r) + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("table", choices=["megatron-lm", "bridge"])
    ap.add_argument("source", help="checkout or git directory of the upstream repository")
    ap.add_argument("--megatron-lm", help="Megatron-LM source (bridge: Megatron-Core's configs)")
    a = ap.parse_args()
    src = Source(a.source)
    if a.table == "megatron-lm":
        write_args_table(src, megatron_lm_rows(src), sys.stdout)
    else:
        bridge_table(src, Source(a.megatron_lm) if a.megatron_lm else None, sys.stdout)


if __name__ == "__main__":
    main()
