"""scripts/gen_tex_surface.py reads pybind11 registrations and C enum values from synthetic C++ snippets."""
from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path

import pytest
from loading import load_file

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "gen_tex_surface.py"


gen = load_file(SCRIPT, "gen_tex_surface", register=True)


def surface(**files: str) -> dict:
    """Surface of an in-memory source tree; keyword names stand for paths ('__' for '/')."""
    return gen.build_surface("0.0", "synthetic", {k.replace("__", "/"): v for k, v in files.items()})


def enum_surface(header: str, bindings: str) -> dict:
    return surface(common_headers__enums_h=header,
                   csrc__pybind_cpp=f'PYBIND11_MODULE(tex, m) {{\n m.def("f", &f);\n{bindings}\n}}')["enums"]


def test_explicit_values():
    header = "namespace te { enum class DType { kByte = 0, kInt32 = 2, kFloat32 = 4 }; }"
    bindings = """py::enum_<te::DType>(m, "DType")
        .value("kByte", te::DType::kByte)
        .value("kFloat32", te::DType::kFloat32)   // kInt32 deliberately not exposed
        .value("kInt32", te::DType::kInt32);"""
    assert enum_surface(header, bindings) == {"DType": {"kByte": 0, "kFloat32": 4, "kInt32": 2}}


def test_implicit_values_follow_the_previous_enumerator():
    header = """enum Mode {
      A,          /* first: 0 */
      B,
      C = 10,
      D,          // 11
      E = -1,
      F,          // 0
    };"""
    bindings = 'py::enum_<Mode>(m, "Mode")' + "".join(f'.value("{x}", Mode::{x})' for x in "ABCDEF") + ";"
    assert enum_surface(header, bindings)["Mode"] == {"A": 0, "B": 1, "C": 10, "D": 11, "E": -1, "F": 0}


def test_initialisers_reference_other_enums_and_use_arithmetic():
    header = """
    enum NVTEDType { kNVTEByte = 0, kNVTEInt32 = 2, kNVTEFloat32 = 4 };
    namespace transformer_engine {
    enum class DType { kByte = kNVTEByte, kInt32 = static_cast<int>(kNVTEInt32), kFloat32 = (int)kNVTEFloat32 };
    enum class Flags : uint32_t { kNone = 0, kA = 1 << 3, kB = 0x10u | kA, kC = DType::kFloat32 * 2 - 1, kD };
    }"""
    bindings = """
    pybind11::enum_<transformer_engine::DType>(m, "DType", pybind11::module_local())
        .value("kByte", transformer_engine::DType::kByte)
        .value("kInt32", transformer_engine::DType::kInt32)
        .value("kFloat32", transformer_engine::DType::kFloat32);
    py::enum_<transformer_engine::Flags>(m, "Flags")
        .value("kA", transformer_engine::Flags::kA).value("kB", transformer_engine::Flags::kB)
        .value("kC", transformer_engine::Flags::kC).value("kD", transformer_engine::Flags::kD);"""
    enums = enum_surface(header, bindings)
    assert enums["DType"] == {"kByte": 0, "kInt32": 2, "kFloat32": 4}
    assert enums["Flags"] == {"kA": 8, "kB": 24, "kC": 7, "kD": 8}


def test_typedef_enum_is_named_by_its_declarator():
    header = """typedef enum {
      NVTE_ROUTING_MAP_FORMAT_BYTEMAP = 0,
      NVTE_ROUTING_MAP_FORMAT_BITMAP_U8,
    } NVTERoutingMapFormat;"""
    bindings = """pybind11::enum_<NVTERoutingMapFormat>(m, "NVTERoutingMapFormat")
        .value("BYTEMAP", NVTE_ROUTING_MAP_FORMAT_BYTEMAP)
        .value("BITMAP_U8", NVTERoutingMapFormat::NVTE_ROUTING_MAP_FORMAT_BITMAP_U8);"""
    assert enum_surface(header, bindings) == {"NVTERoutingMapFormat": {"BITMAP_U8": 1, "BYTEMAP": 0}}


def test_unknown_enumerator_fails_with_one_line_naming_enum_member_and_expression():
    header = "enum class DType { kByte = 0 };"
    bindings = 'py::enum_<DType>(m, "DType")\n  .value("kByte", DType::kByte)\n  .value("kInt64",\n    DType::kInt64);'
    with pytest.raises(gen.SurfaceError) as info:
        enum_surface(header, bindings)
    message = str(info.value)
    assert "\n" not in message
    assert "DType.kInt64" in message and "DType::kInt64" in message and "unknown enumerator" in message


def test_unresolvable_header_initialiser_fails_only_when_registered():
    header = "enum Odd { kSize = sizeof(int), kNext }; enum Fine { kOk = 3 };"
    ok = enum_surface(header, 'py::enum_<Fine>(m, "Fine").value("kOk", kOk);')
    assert ok == {"Fine": {"kOk": 3}}  # the unparsable Odd is never needed
    with pytest.raises(gen.SurfaceError) as info:
        enum_surface(header, 'py::enum_<Odd>(m, "Odd").value("kNext", Odd::kNext);')
    message = str(info.value)
    assert "\n" not in message and "Odd.kSize = sizeof(int)" in message and "Odd.kNext" in message


def test_functions_classes_and_submodules_are_collected():
    pybind = r'''
    #include "helper.h"
    namespace transformer_engine::pytorch {
    void init_router_bindings(pybind11::module &mod) {
      mod.def("fused_topk", &fused_topk, py::arg("logits"));
    }
    }
    #define DECLARE_HANDLES(m)                                  \
      pybind11::class_<te::CommOverlapCore,                     \
                       std::shared_ptr<te::CommOverlapCore>>(m, "CommOverlapCore") \
          .def("is_fp8_ubuf", &te::CommOverlapCore::is_fp8_ubuf); \
      m.def("ubuf_built_with_mpi", &te::ubuf_built_with_mpi);
    PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
      DECLARE_HANDLES(m)
      m.def("generic_gemm", &gemm, "Compute GEMM // not a comment", py::arg("A"));
      m.def(
          "get_stream_priority_range", [](int device_id) { return device_id; });
      // m.def("commented_out", &nothing);
      /* m.def("block_commented", &nothing); */
      transformer_engine::pytorch::init_router_bindings(m);
      auto grouped = m.def_submodule("grouped_mlp_experimental", "Experimental");
      grouped.def("swizzle_scales", &swizzle);
      py::class_<FP8TensorMeta>(m, "FP8TensorMeta")
          .def(py::init<>())
          .def("method_not_a_function", &FP8TensorMeta::f);
      py::class_<Inner>(some_class, "NestedNotTopLevel");
    }'''
    result = surface(csrc__extensions__pybind_cpp=pybind)
    assert result["functions"] == ["fused_topk", "generic_gemm", "get_stream_priority_range", "ubuf_built_with_mpi"]
    assert result["classes"] == ["CommOverlapCore", "FP8TensorMeta"]
    assert result["submodules"] == {"grouped_mlp_experimental": ["swizzle_scales"]}


def write_sdist(path: Path, files: dict[str, str]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, text in files.items():
            info = tarfile.TarInfo(f"transformer_engine_torch-9.9.9/{name}")
            info.size = len(text.encode())
            tar.addfile(info, io.BytesIO(text.encode()))
    path.write_bytes(buf.getvalue())
    return buf.getvalue()


def test_main_writes_the_documented_schema(tmp_path, capsys):
    files = {
        "common_headers/common/include/te.h": "enum class DType { kByte = 0, kInt32 = 2 };",
        "csrc/extensions/pybind.cpp": 'PYBIND11_MODULE(tex, m) { m.def("zeta", &z); m.def("alpha", &a);\n'
                                      'py::enum_<DType>(m, "DType").value("kInt32", DType::kInt32)'
                                      '.value("kByte", DType::kByte); }',
        "csrc/ignored.txt": 'm.def("not_a_source_file", &x);',
    }
    sdist = tmp_path / "transformer_engine_torch-9.9.9.tar.gz"
    raw = write_sdist(sdist, files)
    assert gen.main(["9.9.9", "--sdist", str(sdist), "--out", str(tmp_path / "out")]) == 0
    text = (tmp_path / "out" / "tex_9.9.9.json").read_text()
    data = json.loads(text)
    assert list(data) == ["te_version", "source", "generator", "functions", "classes", "submodules", "enums"]
    assert data["source"] == f"{sdist.name} sha256:{hashlib.sha256(raw).hexdigest()}"
    assert data["functions"] == ["alpha", "zeta"] and data["enums"] == {"DType": {"kByte": 0, "kInt32": 2}}
    assert text == json.dumps(data, indent=1) + "\n" and list(data["enums"]["DType"]) == ["kByte", "kInt32"]

    files["csrc/extensions/pybind.cpp"] = files["csrc/extensions/pybind.cpp"].replace("DType::kByte", "DType::kNope")
    write_sdist(sdist, files)
    capsys.readouterr()
    assert gen.main(["9.9.9", "--sdist", str(sdist), "--out", str(tmp_path / "bad")]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "DType.kByte = DType::kNope" in err
    assert not (tmp_path / "bad").exists()
