#!/usr/bin/env python3
"""Writes the seed corpora of the config/importer fuzz targets into apps/fuzz/corpus/<target>/.

Seeds are small hand-made inputs that reach the interesting paths quickly; the fuzzers grow
from them. Run from the repository root: python3 apps/fuzz/make_corpus.py
"""
import os
import sqlite3
import struct
import tempfile

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")


def write(target, name, data):
    d = os.path.join(ROOT, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


# ---- config_yaml: raw YAML text
write("config_yaml", "flat.yaml", "name: tiny\nnum_layers: 4\nhidden_size: 256\nnum_attention_heads: 4\n"
      "seq_length: 128\nlr: 0.001\nbf16: true\nrecompute_modules: [core_attn, mlp]\n")
write("config_yaml", "sections.yaml", "model:\n  num_layers: 2\nparallel:\n  tensor_model_parallel_size: 2\n"
      "  sequence_parallel: true\nprecision:\n  bf16: true\n")
write("config_yaml", "problems.yaml", "num_layers: four\nnum_layers: 2\noverlap_grad_reduse: true\n"
      "tensor_model_parallel_size: 3\nnum_attention_heads: 8\n[a]: 1\n")
write("config_yaml", "anchors.yaml", "a: &a [core_attn, mlp]\nrecompute_modules: *a\nb: &b {x: 1}\nc: [*b, *b]\n")
write("config_yaml", "strings.yaml", "name: \"caf\\u00e9 \\x1b[31m\"\ndata_path: 'a b'\nlr: .nan\nmin_lr: 1e400\n"
      "seed: -9223372036854775808\n")
write("config_yaml", "override.txt", "recompute_modules=[core_attn, &x mlp, *x]\n")
write("config_yaml", "flow.yaml", "{num_layers: 2, hidden_size: 64, lr_decay_style: cosine, swiglu: false}\n")

# ---- kineto: byte 0 = mode (bit 0 gzip, bit 1 cut the gzip stream, bit 2 HTA last-step drop)
TRACE = ('{"schemaVersion":1,"distributedInfo":{"rank":1,"world_size":2,"backend":"nccl"},'
         '"deviceProperties":[{"id":0,"name":"NVIDIA H100"}],"baseTimeNanoseconds":1700000000000000000,'
         '"traceEvents":['
         '{"ph":"X","cat":"user_annotation","name":"ProfilerStep#1","pid":10,"tid":10,"ts":0,"dur":100},'
         '{"ph":"X","cat":"cuda_runtime","name":"cudaLaunchKernel","pid":10,"tid":10,"ts":5,"dur":3,'
         '"args":{"correlation":7}},'
         '{"ph":"X","cat":"kernel","name":"ampere_sgemm_128x64_nn","pid":0,"tid":7,"ts":9,"dur":40,'
         '"args":{"stream":7,"device":0,"correlation":7}},'
         '{"ph":"X","cat":"kernel","name":"ncclKernel_AllReduce_RING_LL_Sum_float","pid":0,"tid":13,"ts":50,"dur":30,'
         '"args":{"stream":13,"device":0,"In msg nelems":1024,"dtype":"Float","Process Group Name":"0"}},'
         '{"ph":"i","name":"[memory]","pid":0,"tid":0,"ts":20,"args":{"Device Type":1,"Total Allocated":1048576,'
         '"Total Reserved":2097152}},'
         '{"ph":"M","name":"thread_name","pid":10,"tid":10,"args":{"name":"python3"}},'
         '{"ph":"X","cat":"gpu_memcpy","name":"Memcpy HtoD","pid":0,"tid":7,"ts":"95.5","dur":2,'
         '"args":{"stream":7,"device":0,"bytes":4096}}]}')
write("kineto", "plain.json", " " + TRACE)
write("kineto", "gzip.json", "!" + TRACE)
write("kineto", "gzip_cut.json", "#" + TRACE)
write("kineto", "hta_drop.json", "%" + TRACE)
write("kineto", "array_format.json", ' [{"ph":"X","name":"a","pid":1,"tid":1,"ts":1,"dur":1},'
      '{"ph":"B","name":"b","pid":1,"tid":1,"ts":2}]')
write("kineto", "bad_types.json", ' {"traceEvents":[{"ph":"X","name":7,"pid":"GPU 0","tid":"stream 7 ","ts":{},'
      '"dur":[1]},{"ph":"X","cat":"kernel","name":"k","pid":0,"tid":1,"ts":1e30,"dur":-5}]}')

# ---- nsys: structure-aware records (see apps/fuzz/fuzz_nsys.cpp)
TABLES = ["StringIds", "ThreadNames", "PROCESSES", "TARGET_INFO_SESSION_START_TIME", "TARGET_INFO_GPU",
          "TARGET_INFO_SYSTEM_ENV", "EXPORT_META_DATA", "CUPTI_ACTIVITY_KIND_RUNTIME", "CUPTI_ACTIVITY_KIND_KERNEL",
          "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET", "NVTX_EVENTS"]
COLUMNS = [2, 2, 2, 1, 2, 2, 2, 6, 8, 8, 7, 6]


def i64(v):
    return b"\x02" + struct.pack(">q", v)


def text(s):
    b = s if isinstance(s, bytes) else s.encode()
    return b"\x03" + bytes([len(b)]) + b


NULL = b"\x00"
GTID = (1 << 24) | 1
GPID = 1 << 24


def row(table, *values):
    assert len(values) == COLUMNS[TABLES.index(table)], table
    return bytes([TABLES.index(table)]) + b"".join(values)


def mask(*tables):
    m = 0
    for t in tables:
        m |= 1 << TABLES.index(t)
    return struct.pack(">H", m)


ALL = mask(*TABLES)
write("nsys", "runtime_kernel.bin", ALL
      + row("StringIds", i64(1), text("cudaLaunchKernel_v7000"))
      + row("StringIds", i64(2), text("ampere_sgemm_128x64_nn"))
      + row("StringIds", i64(3), text("ProfilerStep#4"))
      + row("StringIds", i64(4), text(b"thread\xff\x1b name"))
      + row("ThreadNames", i64(GTID), i64(4))
      + row("PROCESSES", i64(1), text("python3"))
      + row("TARGET_INFO_SESSION_START_TIME", i64(1700000000000000000))
      + row("TARGET_INFO_GPU", i64(0), text("NVIDIA H100 80GB HBM3"))
      + row("TARGET_INFO_SYSTEM_ENV", text("DeviceEnvironment"), text("A=1;RANK=3;B=2"))
      + row("EXPORT_META_DATA", text("EXPORT_SCHEMA_VERSION"), text("3.13.2"))
      + row("CUPTI_ACTIVITY_KIND_RUNTIME", i64(100), i64(120), i64(0), i64(GTID), i64(9), i64(1))
      + row("CUPTI_ACTIVITY_KIND_KERNEL", i64(130), i64(180), i64(0), i64(7), i64(9), i64(GPID), i64(2), i64(2))
      + row("CUPTI_ACTIVITY_KIND_MEMCPY", i64(190), i64(200), i64(0), i64(7), i64(0), i64(GPID), i64(4096), i64(1))
      + row("CUPTI_ACTIVITY_KIND_MEMSET", i64(201), i64(205), i64(0), i64(7), NULL, i64(GPID), i64(64))
      + row("NVTX_EVENTS", i64(90), i64(300), i64(59), NULL, i64(3), i64(GTID)))
write("nsys", "malformed_rows.bin", ALL
      + row("CUPTI_ACTIVITY_KIND_RUNTIME", text("x"), i64(1), NULL, NULL, i64(-1), i64(99))
      + row("CUPTI_ACTIVITY_KIND_KERNEL", i64(50), i64(10), i64(-1), i64(1 << 40), i64(0), text("p"), NULL, NULL)
      + row("NVTX_EVENTS", i64(1), NULL, i64(60), text(b"\xc0\xafrange"), NULL, i64(GTID))
      + row("CUPTI_ACTIVITY_KIND_MEMCPY", i64(-(1 << 62)), i64(1 << 62), i64(0), i64(0), i64(0), NULL, i64(-5), i64(99)))
write("nsys", "kernels_only.bin", mask("CUPTI_ACTIVITY_KIND_KERNEL")
      + row("CUPTI_ACTIVITY_KIND_KERNEL", i64(1), i64(2), i64(0), i64(7), i64(0), i64(GPID), text("k"), NULL))
write("nsys", "old_schema.bin", struct.pack(">H", 0x8000 | 0x0FFF)
      + row("CUPTI_ACTIVITY_KIND_MEMSET", i64(201), i64(205), i64(0), i64(7), NULL, i64(GPID), i64(64)))

# Raw mode (byte 0 = 0xFF): a small real SQLite file, for SQLite's own handling of damage.
with tempfile.TemporaryDirectory() as tmp:
    p = os.path.join(tmp, "raw.sqlite")
    db = sqlite3.connect(p)
    db.execute("PRAGMA page_size=512")
    db.execute("CREATE TABLE StringIds(id INTEGER PRIMARY KEY, value TEXT)")
    db.execute("INSERT INTO StringIds VALUES(1, 'k')")
    db.execute("CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL(start, end, deviceId, streamId, correlationId, globalPid,"
               " demangledName, shortName)")
    db.execute("INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES(1, 5, 0, 7, 1, ?, 1, 1)", (GPID,))
    db.commit()
    db.close()
    with open(p, "rb") as f:
        write("nsys", "raw_file.bin", b"\xff" + f.read())
