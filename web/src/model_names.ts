// The names a compiled model answers to: its model id and `<model id>-<quantization>` (one
// variant of several); an artifact also answers to its own id. The rule is engine/model_info.py's
// model_names, copied: tests/browser/test_build_and_routes.py runs both on the same names.

export function modelNames(model: string, quantization: string): [string, string] {
  return [model, `${model}-${quantization}`];
}

/** Whether `name` names this model (`id`: its artifact's id, where it has one). */
export function answersTo(name: string, entry: { model: string; quantization: string; id?: string }): boolean {
  return modelNames(entry.model, entry.quantization).includes(name) || (entry.id !== undefined && entry.id === name);
}
