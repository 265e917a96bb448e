// The files of one of an artifact's kernel sets (the manifest's kernel_sets[kind]): the set
// itself where it is one file (a library, a source), else its kernels (WGSL, one file each).
// The rule is engine/artifact.py's kernel_files, copied: tests/browser/test_build_and_routes.py
// runs both on a compiled artifact's manifest. (The worker fetches them before Python boots.)

export interface KernelFile {
  file: string;
  sha256: string;
}

export function kernelSetFiles(set: { file?: string; sha256?: string; kernels?: KernelFile[] }): KernelFile[] {
  return "file" in set ? [set as KernelFile] : [...(set.kernels ?? [])];
}
