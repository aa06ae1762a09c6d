// lincheck checks a key-value history recorded by Causeway's tests for
// linearizability with porcupine (github.com/anishathalye/porcupine).
//
// Input (stdin): a JSON array of operations
//
//	{"client": 0, "op": "get"|"put", "key": "k", "value": "v", "output": "v",
//	 "call": <ns>, "return": <ns>}
//
// where a get's "output" is the value read ("" for nil) and a put whose
// outcome is unknown (it timed out) has "return" = -1: it may have taken
// effect at any time after its call. Exit status 0: linearizable; 1: not;
// 2: bad input or the check timed out.
package main

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"sort"
	"time"

	"github.com/anishathalye/porcupine"
)

type op struct {
	Client int    `json:"client"`
	Op     string `json:"op"`
	Key    string `json:"key"`
	Value  string `json:"value"`
	Output string `json:"output"`
	Call   int64  `json:"call"`
	Return int64  `json:"return"`
}

type input struct {
	put   bool
	key   string
	value string
}

// A register per key: a history is linearizable iff each key's is.
var model = porcupine.Model{
	Partition: func(history []porcupine.Operation) [][]porcupine.Operation {
		byKey := map[string][]porcupine.Operation{}
		var keys []string
		for _, o := range history {
			k := o.Input.(input).key
			if _, ok := byKey[k]; !ok {
				keys = append(keys, k)
			}
			byKey[k] = append(byKey[k], o)
		}
		out := make([][]porcupine.Operation, 0, len(keys))
		for _, k := range keys {
			out = append(out, byKey[k])
		}
		return out
	},
	Init: func() interface{} { return "" },
	Step: func(state, in, output interface{}) (bool, interface{}) {
		i := in.(input)
		if i.put {
			return true, i.value
		}
		return output.(string) == state.(string), state
	},
	Equal: func(a, b interface{}) bool { return a.(string) == b.(string) },
	DescribeOperation: func(in, output interface{}) string {
		i := in.(input)
		if i.put {
			return fmt.Sprintf("put(%s, %s)", i.key, i.value)
		}
		return fmt.Sprintf("get(%s) -> %q", i.key, output)
	},
}

func main() {
	var ops []op
	if err := json.NewDecoder(os.Stdin).Decode(&ops); err != nil {
		fmt.Fprintln(os.Stderr, "lincheck: bad history:", err)
		os.Exit(2)
	}
	history := make([]porcupine.Operation, 0, len(ops))
	for _, o := range ops {
		ret := o.Return
		if ret < 0 {
			ret = math.MaxInt64
		}
		history = append(history, porcupine.Operation{
			ClientId: o.Client,
			Input:    input{put: o.Op == "put", key: o.Key, value: o.Value},
			Call:     o.Call,
			Output:   o.Output,
			Return:   ret,
		})
	}
	switch porcupine.CheckOperationsTimeout(model, history, 60*time.Second) {
	case porcupine.Ok:
		fmt.Printf("lincheck: %d operations are linearizable\n", len(history))
	case porcupine.Illegal:
		fmt.Printf("lincheck: %d operations are NOT linearizable\n", len(history))
		explain(history)
		os.Exit(1)
	default:
		fmt.Println("lincheck: the check timed out")
		os.Exit(2)
	}
}

// explain prints the operations on each key whose own history fails, in
// call order, to show where to look.
func explain(history []porcupine.Operation) {
	for _, part := range model.Partition(history) {
		if porcupine.CheckOperations(model, part) {
			continue
		}
		sort.Slice(part, func(i, j int) bool { return part[i].Call < part[j].Call })
		fmt.Printf("key %s:\n", part[0].Input.(input).key)
		for _, o := range part {
			ret := fmt.Sprint(o.Return)
			if o.Return == math.MaxInt64 {
				ret = "?"
			}
			fmt.Printf("  [%d, %s] client %d %s\n", o.Call, ret, o.ClientId, model.DescribeOperation(o.Input, o.Output))
		}
	}
}
