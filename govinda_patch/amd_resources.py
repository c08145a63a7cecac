"""Register, LDS and scratch use of a kernel compiled for a CDNA target, and the occupancy it allows.

Occupancy model for gfx90a (MI200) and gfx942 (MI300), wave64, from the LLVM AMDGPU backend's
occupancy rules (``GCNSubtarget::getOccupancyWith*``, ``AMDGPUUsage``) and the CDNA ISA guides:

* each SIMD has 512 vector registers per lane, one unified file shared by the architectural
  VGPRs and the AGPRs. A wave that uses AGPRs takes ``align(arch_vgprs, 4) + agprs`` of them
  (the listing's ``TotalNumVgprs``), allocated in granules of 8:
  ``waves_vgpr = min(8, floor(512 / align(total_vgprs, 8)))``;
* SGPRs (``TotalNumSgprs``, incl. VCC/flat-scratch): gfx9's table allows 10/9/8 waves up to
  80/88/100 SGPRs and 7 above (at most 102 are addressable); capped at the 8 waves per SIMD
  of these targets: ``waves_sgpr = 8 if sgprs <= 100 else 7``;
* LDS: 64 KiB per CU, shared by the workgroups on it; a workgroup of ``num_warps`` waves puts
  ``num_warps / 4`` waves on each of the CU's 4 SIMDs:
  ``waves_lds = min(8, floor(floor(65536 / lds) * num_warps / 4))`` (8 when no LDS is used);
* waves per SIMD = ``min(waves_vgpr, waves_sgpr, waves_lds)``.

LDS is Triton's ``metadata.shared``: the listing's group segment is 0 because Triton asks for
the LDS at launch, so the compiler's own ``; Occupancy:`` comment (kept as ``compiler_occupancy``)
ignores it.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass

VGPRS_PER_SIMD_LANE = 512
VGPR_GRANULE = 8
# gfx9 SGPR occupancy steps: (most SGPRs, waves).
SGPR_STEPS = ((80, 10), (88, 9), (100, 8))
SGPR_WAVES_ABOVE = 7
MAX_WAVES_PER_SIMD = 8
LDS_BYTES_PER_CU = 64 * 1024
SIMDS_PER_CU = 4

_LISTING_FIELDS = {
    "arch_vgprs": "NumVgprs",
    "agprs": "NumAgprs",
    "total_vgprs": "TotalNumVgprs",
    "sgprs": "TotalNumSgprs",
    "scratch_bytes": "ScratchSize",
    "compiler_occupancy": "Occupancy",
}


@dataclass(frozen=True)
class AmdResources:
    arch_vgprs: int
    agprs: int
    total_vgprs: int
    sgprs: int
    scratch_bytes: int
    lds_bytes: int
    num_warps: int
    compiler_occupancy: int
    vgpr_spills: int = 0
    sgpr_spills: int = 0

    @property
    def waves_by_vgpr(self) -> int:
        granular = _align(max(self.total_vgprs, 1), VGPR_GRANULE)
        return max(1, min(MAX_WAVES_PER_SIMD, VGPRS_PER_SIMD_LANE // granular))

    @property
    def waves_by_sgpr(self) -> int:
        waves = next((w for limit, w in SGPR_STEPS if self.sgprs <= limit), SGPR_WAVES_ABOVE)
        return min(MAX_WAVES_PER_SIMD, waves)

    @property
    def waves_by_lds(self) -> int:
        if self.lds_bytes <= 0:
            return MAX_WAVES_PER_SIMD
        workgroups = LDS_BYTES_PER_CU // self.lds_bytes
        return min(MAX_WAVES_PER_SIMD, workgroups * self.num_warps // SIMDS_PER_CU)

    @property
    def waves_per_simd(self) -> int:
        return min(self.waves_by_vgpr, self.waves_by_sgpr, self.waves_by_lds)

    @property
    def limited_by(self) -> str:
        limits = {"vgpr": self.waves_by_vgpr, "sgpr": self.waves_by_sgpr, "lds": self.waves_by_lds}
        low = min(limits.values())
        if low >= MAX_WAVES_PER_SIMD:
            return "hardware max"
        return "+".join(name for name, value in limits.items() if value == low)

    def problems(self) -> list[str]:
        """Why this kernel must not ship on the target (empty: fine)."""
        found = []
        # VGPR spills without scratch went to AGPRs (gfx90a+): slower, but no memory traffic.
        if self.scratch_bytes > 0:
            found.append(f"scratch {self.scratch_bytes} B ({self.vgpr_spills} VGPR spills)")
        if self.lds_bytes > LDS_BYTES_PER_CU:
            found.append(f"LDS {self.lds_bytes} B > {LDS_BYTES_PER_CU} B")
        if self.waves_by_lds == 0:
            found.append(f"LDS {self.lds_bytes} B leaves no room for a {self.num_warps}-wave workgroup")
        return found

    def as_dict(self) -> dict:
        data = asdict(self)
        data.update(
            waves_by_vgpr=self.waves_by_vgpr,
            waves_by_sgpr=self.waves_by_sgpr,
            waves_by_lds=self.waves_by_lds,
            waves_per_simd=self.waves_per_simd,
            limited_by=self.limited_by,
        )
        return data


def _align(value: int, granule: int) -> int:
    return -(-value // granule) * granule


def _listing_value(listing: str, name: str) -> int:
    match = re.search(rf"^;\s*{name}:\s*(\d+)", listing, re.MULTILINE)
    if match is None:
        raise ValueError(f"the AMDGCN listing has no '; {name}:' line")
    return int(match.group(1))


def _metadata_value(listing: str, name: str) -> int:
    match = re.search(rf"\.{name}:\s+(\d+)", listing)
    return int(match.group(1)) if match else 0


def parse_listing(listing: str, *, lds_bytes: int, num_warps: int) -> AmdResources:
    """Resources from one kernel's AMDGCN listing (Triton's ``asm["amdgcn"]``)."""
    # Targets before gfx90a (gfx906: no AGPRs, no unified register file) list neither AGPRs nor
    # a total: there the total is the arch VGPRs.
    values = {
        field: _listing_value(listing, name)
        for field, name in _LISTING_FIELDS.items()
        if field not in ("agprs", "total_vgprs") or re.search(rf"^;\s*{name}:", listing, re.MULTILINE)
    }
    values.setdefault("agprs", 0)
    values.setdefault("total_vgprs", values["arch_vgprs"])
    return AmdResources(
        **values,
        lds_bytes=int(lds_bytes),
        num_warps=int(num_warps),
        vgpr_spills=_metadata_value(listing, "vgpr_spill_count"),
        sgpr_spills=_metadata_value(listing, "sgpr_spill_count"),
    )
