package kubeletdra

import (
	"fmt"
	"strconv"
	"sync/atomic"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

// NewClientset is client-go's fake clientset holding objects, made to
// write objects as the apiserver does in two ways the DRA helpers rely
// on: a created object is named from its generateName (the
// ResourceSlice controller creates slices so, and would otherwise find
// them unnamed and recreate them at every sync), and every write stamps
// a new, larger resourceVersion (the controller's mutation cache keeps
// its own writes until the informer shows a newer version; without one
// it takes the informer's stale copy and the driver's change waits for
// the 30-second resync).
func NewClientset(objects ...runtime.Object) *fake.Clientset {
	c := fake.NewClientset(objects...)
	var version, names atomic.Int64
	version.Store(1000) // above the tracker's versions of the seed objects
	write := func(action k8stesting.Action) (bool, runtime.Object, error) {
		if action.GetSubresource() != "" {
			return false, nil, nil
		}
		var obj runtime.Object
		// Creates and updates (an UpdateAction is a CreateAction too).
		switch a := action.(type) {
		case k8stesting.CreateAction:
			obj = a.GetObject()
		default:
			return false, nil, nil
		}
		obj = obj.DeepCopyObject()
		m, err := meta.Accessor(obj)
		if err != nil {
			return false, nil, nil //nolint:nilerr // no metadata: not an object this stamps; the tracker answers
		}
		if m.GetName() == "" && m.GetGenerateName() != "" {
			m.SetName(fmt.Sprintf("%s%05d", m.GetGenerateName(), names.Add(1)))
		}
		m.SetResourceVersion(strconv.FormatInt(version.Add(1), 10))
		gvr, ns := action.GetResource(), action.GetNamespace()
		if action.GetVerb() == "create" {
			err = c.Tracker().Create(gvr, obj, ns)
		} else {
			err = c.Tracker().Update(gvr, obj, ns)
		}
		if err != nil {
			return true, nil, err
		}
		return true, obj.DeepCopyObject(), nil
	}
	c.PrependReactor("create", "*", write)
	c.PrependReactor("update", "*", write)
	return c
}
