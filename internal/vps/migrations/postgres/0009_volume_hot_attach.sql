-- Hot attach and detach: a volume is attaching or detaching while bcd
-- plugs it into (or out of) its instance's guest.
ALTER TABLE volumes DROP CONSTRAINT volumes_state_check;
ALTER TABLE volumes ADD CONSTRAINT volumes_state_check
    CHECK (state IN ('creating', 'available', 'attaching', 'attached', 'detaching', 'deleting', 'deleted', 'failed'));
